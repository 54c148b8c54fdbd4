-- walk_prior.lua: a queue's record of walking away, begun from the operator's other queues (issue 18).
--
-- KEYS: the standard queue keys (see _lib.lua); only K_ST is touched.
-- ARGV[1 .. 2 * HAZARD_NB]: sums in 'hz' form (walked away, seconds waited, per band of time waited;
--   _estimates.lua), pooled from the operator's queues that have run sales and scaled down to a few
--   visitors' weight (services/recovery.py walk_prior)
--
-- Returns 1 when the queue took them, 0 when it has a record of its own (it keeps it) or they are not
-- in the form the bands have (a process of another version). A queue that has admitted nobody has no
-- record of its own: what it holds is the prior a tick saved (one may run between the epoch's start and
-- this call), and it takes these.
--
-- A queue that has seen nobody go tells its first crowd waits in which nobody walks away: in a sale where
-- 40 % do, its first burst was told 1.10 of its waits (bench/RESULTS.md). Begun from how the operator's
-- crowds behave, the queue's own departures and its line then outweigh these within its first minute.

if #ARGV ~= 2 * HAZARD_NB then return 0 end
local own = redis.call('HMGET', K_ST, 'hz', 'admitted')
if own[1] and (tonumber(own[2]) or 0) > 0 then return 0 end
local h = {}
for i = 1, 2 * HAZARD_NB do h[i] = math.max(0, tonumber(ARGV[i]) or 0) end
hazard_save(h)
return 1
