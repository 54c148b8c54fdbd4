-- hold_prior.lua: a queue's record of how long its slots are held, begun from the operator's other
-- queues (issue 18).
--
-- KEYS: the standard queue keys (see _lib.lua); only K_ST is touched.
-- ARGV[1] the mean hold (ms; 'ema_service_ms')
-- ARGV[2 .. 1 + HOLD_NB] holds given back per band of time held ('svh'), then ARGV[2 + HOLD_NB ..
--   1 + 2 * HOLD_NB] the slot-seconds spent in each band ('svx' without its time): _estimates.lua's
--   form, pooled from the operator's queues that have given slots back and scaled down to a few holds'
--   weight (services/recovery.py hold_prior)
-- ARGV[2 + 2 * HOLD_NB] the mean claim wait of those let in from the line (ms; 'cwl'), -1 when none is
--   known (optional: a process of the version before sends none)
--
-- Returns 1 when the queue took them, 0 when it has a record of its own (a slot has come back: it
-- keeps it) or they are not in the form the bands have (a process of another version).
--
-- A queue that has had no slot back cannot say how long sessions last: a crowd that fills its capacity
-- at once was told no wait (the page said "working it out") until the first came back, ten or more
-- seconds into the sale (bench/RESULTS.md). Begun from how long the operator's other queues' sessions
-- last, it tells them one from the start; its own holds, those still out and those given back, then
-- outweigh these within its first slots.

if #ARGV ~= 1 + 2 * HOLD_NB and #ARGV ~= 2 + 2 * HOLD_NB then return 0 end
if redis.call('HEXISTS', K_ST, 'ema_service_ms') == 1 then return 0 end
local mean = tonumber(ARGV[1])
if not mean or mean <= 0 or mean ~= mean or mean == math.huge then return 0 end
local h, x, given = {}, {}, 0
for b = 1, HOLD_NB do
  h[b] = math.max(0, tonumber(ARGV[1 + b]) or 0)
  x[b] = math.max(0, tonumber(ARGV[1 + HOLD_NB + b]) or 0)
  given = given + h[b]
end
if given <= 0 then return 0 end
-- svx's time 0: no look yet, so the first look (or hold given back) counts each slot held from its start
redis.call('HSET', K_ST, 'ema_service_ms', fmt(mean), 'svc_n', fmt(given), 'svh', fmt_all(h), 'svx', '0 ' .. fmt_all(x))
local claim = tonumber(ARGV[2 + 2 * HOLD_NB] or '')
-- as one claim: the queue's own claims from the line outweigh it from the first (claim_note)
if claim and claim >= 0 and claim < math.huge and redis.call('HEXISTS', K_ST, 'cwl') == 0 then
  redis.call('HSET', K_ST, 'cwl', fmt(claim) .. ' 1')
end
return 1
