-- capacity.lua: the protected site reports how many sessions it serves right now.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] in use (absolute: a lost report cannot make the count drift, seed 001)    ARGV[2] now (ms)
--
-- Returns {capacity, used, capacity_source} after the report, or {} when the policy is not in Redis.

local in_use, now = tonumber(ARGV[1]), tonumber(ARGV[2])
local p = policy()
if not p then return {} end
redis.call('HSET', K_ST, 'reported_in_use', in_use, 'reported_at', now)
local st = hash_table(K_ST)
return {p.capacity, used_slots(p, st), p.capacity_source}
