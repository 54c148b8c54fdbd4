-- window/epoch.lua: start a stateless queue's window for an epoch (SPEC 3.6 and 4), or tell that it runs.
--
-- KEYS[1] win: the queue's window HASH
-- ARGV[1] epoch   ARGV[2] floor: every number at or below it may have been issued already
-- ARGV[3] highest number this epoch may issue   ARGV[4] the window's last active place, as the database
-- last saw it   ARGV[5] the gap of this epoch (numbers skipped, see tick.lua)   ARGV[6] now (ms)
--
-- Returns 1 when this call started the epoch, 0 when it was live already. Numbers resume above the
-- floor; the window resumes where the database saw it last, so earlier tickets keep their places.

local win = KEYS[1]
if redis.call('HGET', win, 'live') == ARGV[1] then return 0 end
local floor = tonumber(ARGV[2])
if (tonumber(redis.call('HGET', win, 'next')) or 0) < floor then redis.call('HSET', win, 'next', floor) end
if (tonumber(redis.call('HGET', win, 'active')) or 0) < tonumber(ARGV[4]) then
  redis.call('HSET', win, 'active', ARGV[4])
end
redis.call('HSETNX', win, 'at', ARGV[6])
redis.call('HSET', win, 'live', ARGV[1], 'epoch', ARGV[1], 'max', ARGV[3], 'gap', ARGV[5], 'gap:' .. ARGV[1], ARGV[5])
return 1
