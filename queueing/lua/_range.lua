-- _range.lua: how far waits fall from what was told (the range the API gives around an estimate), and the
-- spells without admission no estimate could foresee, which it does not learn from (part of the library:
-- _lib.lua; the estimate itself: _estimates.lua).
--!exports: wait_learn opened_note

-- How far waits fall from what was told: w_lo and w_hi follow the 10th and 90th percentiles of
-- ln(wait had / wait told at the join) over the queue's admissions (a stochastic quantile estimate: one
-- step per admission, bounded memory). A step is WAIT_STEP of the range's width, so a queue whose waits
-- come out close to what was told gets a range that close, not one a fixed step wide (at 0.08 a step, a
-- steady sale's range held 95 % of its waits, not 80 %). The API's estimated_wait_range is the estimate
-- times e^w_lo .. e^w_hi. Until a queue has a record, a wide range: 0.7 to 1.4 times.
-- Returns true when admission stopped while it waited (a pause, a close: off_ms, opened_note), which
-- lengthened its wait by a spell no estimate could foresee: its sample says so (the dashboard and the
-- simulator leave such waits out of the estimate's error).
local WAIT_STEP, WAIT_STEP_MIN = 0.12, 0.01

function wait_learn(rec, now)
  local b = redis.call('HMGET', K_ST, 'w_lo', 'w_hi', 'opened_ms', 'off_ms')
  local stopped = rec[R_JOINED] < (tonumber(b[4]) or 0)
  local told = tonumber(rec[R_EST]) or -1
  local had_s = (now - rec[R_JOINED]) / 1000
  if told < 1 or had_s < 1 then return stopped end
  if rec[R_JOINED] < (tonumber(b[3]) or 0) then return stopped end  -- it waited through a spell: no lesson
  local x = math.log(had_s / told)
  local lo, hi = tonumber(b[1]) or WAIT_LO_FIRST, tonumber(b[2]) or WAIT_HI_FIRST
  local step = math.max(WAIT_STEP_MIN, WAIT_STEP * (hi - lo))
  if x < lo then lo = lo - step * 0.9 else lo = lo + step * 0.1 end
  if x > hi then hi = hi + step * 0.9 else hi = hi - step * 0.1 end
  redis.call('HSET', K_ST, 'w_lo', fmt(math.max(-3, math.min(lo, 0))), 'w_hi', fmt(math.min(3, math.max(hi, 0))))
  return stopped
end

-- When admission last began again after a spell without it (paused, closed, before a start: opened_ms)
-- and when that spell began (off_ms; adm_off while it lasts): waits that began before opened_ms were not
-- the estimate's to learn from (wait_learn), and those that began before off_ms were lengthened by a
-- stop that came after their join. The wait for a scheduled start was foreseen: a spell that began before
-- the start is noted as having begun at 0 (lengthening nobody's). The admission script notes it.
function opened_note(p, st, now)
  if admitting(p, now) then
    if st.adm_off then
      redis.call('HSET', K_ST, 'opened_ms', now, 'off_ms', tonumber(st.adm_off) or 0)
      redis.call('HDEL', K_ST, 'adm_off')
    end
  elseif not st.adm_off then  -- (before a scheduled start: foreseen, the estimate counts the time until it)
    redis.call('HSET', K_ST, 'adm_off', now < p.starts_at_ms and 0 or now)
  end
end
