-- viewer_close.lua: a websocket gives its lease back (it closed); its ticket stops being a watcher
-- when this was its last live socket.
--
-- KEYS[1] the ticket's sockets  ZSET  socket id -> lease end (ms)        (see viewer_open.lua)
-- KEYS[2] the queue's watchers  ZSET  ticket id -> end of its newest socket lease (ms)
-- ARGV[1] socket id   ARGV[2] ticket id   ARGV[3] now (ms)
--
-- Returns the ticket's live sockets left.

local K_SOCKETS, K_WATCHERS = KEYS[1], KEYS[2]
local socket, ticket, now = ARGV[1], ARGV[2], tonumber(ARGV[3])

redis.call('ZREM', K_SOCKETS, socket)
redis.call('ZREMRANGEBYSCORE', K_SOCKETS, '-inf', now)
local newest = redis.call('ZRANGE', K_SOCKETS, -1, -1, 'WITHSCORES')
if newest[2] then
  redis.call('ZADD', K_WATCHERS, newest[2], ticket)
  return redis.call('ZCARD', K_SOCKETS)
end
redis.call('ZREM', K_WATCHERS, ticket)
return 0
