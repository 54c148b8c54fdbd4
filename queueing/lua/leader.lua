-- leader.lua: take or keep the admission leader lease for one queue (seed 000).
--
-- KEYS: the standard queue keys (see _lib.lua); uses leader and st.
-- ARGV[1] instance id (one per worker node)     ARGV[2] lease TTL (ms)
--
-- Returns the leader token "<instance>:<term>" when this instance leads (the lease is taken or
-- extended), or false when another instance holds it. The term grows with every new lease, so a
-- token from an earlier lease never matches again (admit.lua refuses it).

local instance, ttl = ARGV[1], tonumber(ARGV[2])
local current = redis.call('GET', K_LEADER)
if current then
  if string.sub(current, 1, #instance + 1) == instance .. ':' then
    redis.call('PEXPIRE', K_LEADER, ttl)
    return current
  end
  return false
end
local term = redis.call('HINCRBY', K_ST, 'leader_term', 1)
local token = instance .. ':' .. term
redis.call('SET', K_LEADER, token, 'PX', ttl)
return token
