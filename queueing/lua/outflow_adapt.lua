-- outflow_adapt.lua: one step of the adaptive outflow (additive increase, multiplicative decrease).
--
-- KEYS: the standard queue keys (see _lib.lua); uses cfg, st, line and leader.
-- ARGV[1] now (ms)     ARGV[2] the tick's leader token
-- ARGV[3] verdict 'increase' | 'decrease' | 'hold', judged in Python from the site's health reports
--         (queueing/health.py outflow_verdict)
--
-- Returns {outcome, rate before, rate after} (admissions a minute, as strings):
--   'adapted'      the verdict was applied (after = before when held, or already at a bound)
--   'not_admitting' held: the queue admits nobody now (paused, closed, before its start or shuffle)
--   'not_limiting'  held instead of raised: nobody is waiting, so the outflow was not what bounded
--                   admission and a healthy site says nothing about a higher rate
--   'not_due'      the last step was less than adaptive_interval_seconds ago
--   'not_leader'   the token is not the queue's leader lease
--   'off'          adaptive outflow is off, or the queue's policy is not in Redis
-- The rate starts from the configured outflow (also when Redis lost st: outflow_effective is gone),
-- and stays within [outflow_min_per_minute, outflow_max_per_minute]. Only the leader adapts, at most
-- once per interval (st.outflow_adapted_at), so two tick runners never both act on the same evidence.
-- Every step but 'not_due', 'not_leader' and 'off' starts a new interval.

local now, token, verdict = tonumber(ARGV[1]), ARGV[2], ARGV[3]

if redis.call('GET', K_LEADER) ~= token then
  return {'not_leader', '0', '0'}
end
local p = policy()
if not p then return {'off', '0', '0'} end
local before = fmt(p.outflow)
local c = redis.call('HMGET', K_CFG, 'adaptive_outflow', 'outflow_min_per_minute', 'outflow_max_per_minute',
  'adaptive_step_per_minute', 'adaptive_decrease_factor', 'adaptive_interval_seconds')
if c[1] ~= '1' then return {'off', before, before} end
local low, high = tonumber(c[2]) or p.outflow, tonumber(c[3]) or p.outflow
local step, factor = tonumber(c[4]) or 0, tonumber(c[5]) or 1
local interval_ms = (tonumber(c[6]) or 10) * 1000

local last = tonumber(redis.call('HGET', K_ST, 'outflow_adapted_at'))
-- A clock that went back (another node's, say) must not stall adaptation until it catches up.
if last and now >= last and now < last + interval_ms then
  return {'not_due', before, before}
end

local outcome, rate = 'adapted', p.outflow
if not admitting(p, now) then
  outcome = 'not_admitting'
elseif verdict == 'decrease' then
  rate = rate * factor
elseif verdict == 'increase' then
  if line_count() > 0 then rate = rate + step else outcome = 'not_limiting' end
end
rate = math.min(high, math.max(low, rate))
redis.call('HSET', K_ST, 'outflow_effective', fmt(rate), 'outflow_adapted_at', now)
return {outcome, before, fmt(rate)}
