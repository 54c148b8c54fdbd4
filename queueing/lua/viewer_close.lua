-- viewer_close.lua: websockets of one queue give their leases back (they closed, together: a server
-- gives back all that closed since its last call, wsserver.RollCall); a ticket stops being a watcher
-- when its last live socket has closed.
--
-- KEYS[1] the queue's watchers  ZSET  ticket id -> end of its newest socket lease (ms)
--         each ticket's sockets '<the queue's keys>sockets:<ticket id>'  ZSET  socket id -> lease end (ms)
--         (see viewer_open.lua; the same hash tag as KEYS[1])
-- ARGV[1] now (ms)   then two per socket: socket id, ticket id
--
-- Returns the number of leases given back.

local K_WATCHERS = KEYS[1]
local base = string.sub(K_WATCHERS, 1, -#'watchers' - 1)
local now = tonumber(ARGV[1])

local n = (#ARGV - 1) / 2
for i = 1, n do
  local socket, ticket = ARGV[2 * i], ARGV[2 * i + 1]
  local sockets = base .. 'sockets:' .. ticket
  redis.call('ZREM', sockets, socket)
  redis.call('ZREMRANGEBYSCORE', sockets, '-inf', now)
  local newest = redis.call('ZRANGE', sockets, -1, -1, 'WITHSCORES')
  if newest[2] then
    redis.call('ZADD', K_WATCHERS, newest[2], ticket)
  else
    redis.call('ZREM', K_WATCHERS, ticket)
  end
end
return n
