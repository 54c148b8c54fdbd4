-- _priority.lua: priority joiners' arrival rates, and how many of them a wait expects to be placed ahead
-- (part of the library: _lib.lua; used by the estimate, _estimates.lua).
--!exports: priority_note priority_ahead_rate priority_cutters

-- Priority joiners' arrival rates per level, two ways: 'pri' = "f1 f2 f3 <ms> s1 s2 s3 <first ms>", each
-- an EMA of joins a second, f over RATE_TAU_S (the rate now) and s over PRIORITY_SLOW_S (the sale's). An
-- EMA begun from none reads low until it has run its span (a steady stream at r reads 0.18 r a minute in),
-- so s is read over the time since the first priority joiner, but never less than PRIORITY_SLOW_MIN_S:
-- a rush of codes in a sale's first seconds is not a rate for minutes. The form without s (before it was
-- kept) reads s as f, the rate now kept for good, as it was.
local PRIORITY_SLOW_S, PRIORITY_SLOW_MIN_S = 300, 60
-- The EMAs as kept, decayed to now: f, s (nil for the form without s), the first joiner's ms.
local function priority_kept(st, now)
  if not st.pri then return nil end
  local v = {}
  for x in string.gmatch(st.pri, '%S+') do v[#v + 1] = tonumber(x) or 0 end
  if #v ~= 4 and #v ~= 8 then return nil end
  local age_s = math.max(0, now - v[4]) / 1000
  local fast = math.exp(-age_s / RATE_TAU_S)
  local f = {v[1] * fast, v[2] * fast, v[3] * fast}
  if #v == 4 then return f, nil, now end
  local slow = math.exp(-age_s / PRIORITY_SLOW_S)
  return f, {v[5] * slow, v[6] * slow, v[7] * slow}, v[8]
end

local function priority_rates(st, now)
  local f, s, first = priority_kept(st, now)
  if f == nil then return nil end
  if s == nil then return f, {f[1], f[2], f[3]} end
  local since_s = math.max(0, now - first) / 1000
  local over = math.max(1 - math.exp(-since_s / PRIORITY_SLOW_S), PRIORITY_SLOW_MIN_S / PRIORITY_SLOW_S)
  return f, {s[1] / over, s[2] / over, s[3] / over}
end

function priority_note(st, level, now)
  local f, s, first = priority_kept(st, now)
  f, s, first = f or {0, 0, 0}, s or {0, 0, 0}, first or now
  f[level], s[level] = f[level] + 1 / RATE_TAU_S, s[level] + 1 / PRIORITY_SLOW_S
  st.pri = string.format('%.6g %.6g %.6g %d %.6g %.6g %.6g %d', f[1], f[2], f[3], now, s[1], s[2], s[3], first)
  redis.call('HSET', K_ST, 'pri', st.pri)
end

-- How many priority joiners a second are expected to be placed ahead of a visitor of priority `level`
-- with `ahead` in front, averaged over its wait: a joiner of a higher level goes ahead while the visitor
-- is further back than that level's place, (1 - fraction) of the line; as the visitor moves up linearly
-- from `ahead` to the head, that is the first 1 - (1 - fraction) * line / ahead of its wait. (One of its
-- own level or lower goes behind it: behind the last earlier joiner of its level or higher.) Two rates,
-- now's and the sale's: priority_cutters.
function priority_ahead_rate(p, st, ahead, level, now)
  local rates, slow = priority_rates(st, now)
  if rates == nil or ahead <= 0 then return 0, 0 end
  local line = line_count()
  local rate, rate_slow = 0, 0
  for higher = level + 1, 3 do
    if rates[higher] > 0 or slow[higher] > 0 then
      local share = 1 - (1 - (p.fractions[higher] or 0)) * line / ahead
      if share > 0 then
        rate, rate_slow = rate + rates[higher] * math.min(1, share), rate_slow + slow[higher] * math.min(1, share)
      end
    end
  end
  return rate, rate_slow
end

-- Priority joiners placed ahead over the next t seconds, at the rate now (f) falling back to the sale's
-- (s) over RATE_TAU_S: s t + (f - s) RATE_TAU_S (1 - e^(-t / RATE_TAU_S)). Sales open with a rush, codes
-- and all: in the simulator's forty-percent sale ten joined with a code in its first five seconds and five
-- more over the next minute, and the rate of the rush kept for the whole wait told the back of the first
-- burst twenty joiners ahead of it, where ten came. Joiners who keep coming at one rate have f = s.
function priority_cutters(fast, slow, t)
  return slow * t + (fast - slow) * RATE_TAU_S * (1 - math.exp(-t / RATE_TAU_S))
end
