-- viewer_open.lua: a websocket takes (or renews) its lease under its ticket, if the ticket has room.
--
-- KEYS[1] the ticket's sockets  ZSET  socket id -> lease end (ms)        (store.viewers keys)
-- KEYS[2] the queue's watchers  ZSET  ticket id -> end of its newest socket lease (ms)
-- ARGV[1] socket id   ARGV[2] ticket id   ARGV[3] now (ms)   ARGV[4] lease length (ms)
-- ARGV[5] most live sockets per ticket (0: no cap; a server renewing the leases of sockets it holds)
--
-- Returns {1, live sockets of the ticket} when the lease is taken or renewed, or {0, live sockets}
-- when the ticket already holds ARGV[5] of them (this one is then not counted anywhere).
-- The stats count the watchers (tickets), so a visitor's many tabs are one viewer.

local K_SOCKETS, K_WATCHERS = KEYS[1], KEYS[2]
local socket, ticket = ARGV[1], ARGV[2]
local now, lease, cap = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

redis.call('ZREMRANGEBYSCORE', K_SOCKETS, '-inf', now)
local held = redis.call('ZCARD', K_SOCKETS)
if cap > 0 and held >= cap and not redis.call('ZSCORE', K_SOCKETS, socket) then
  return {0, held}
end
redis.call('ZADD', K_SOCKETS, now + lease, socket)
redis.call('PEXPIRE', K_SOCKETS, lease)
redis.call('ZADD', K_WATCHERS, now + lease, ticket)
redis.call('ZREMRANGEBYSCORE', K_WATCHERS, '-inf', now)
redis.call('PEXPIRE', K_WATCHERS, lease)
return {1, redis.call('ZCARD', K_SOCKETS)}
