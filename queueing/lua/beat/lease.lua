-- beat/lease.lua: take or keep the lease that lets one Celery beat send the periodic tasks.
--
-- KEYS[1] the lease key    ARGV[1] this beat's name    ARGV[2] lease length (ms)
-- Returns the name of the beat holding the lease afterwards: ARGV[1] when this one leads.
local holder = redis.call('GET', KEYS[1])
if not holder or holder == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return ARGV[1]
end
return holder
