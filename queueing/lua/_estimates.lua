-- _estimates.lua: the wait a visitor is told, and what it is learnt from: priority joiners' rates,
-- walking away as a hazard by time waited (from the head and from the line), the slots that come back, the
-- range from told-versus-had (part of the library: _lib.lua). Issue 18; bench/estimate_sim.py measures it.

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

local function priority_note(st, level, now)
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
local function priority_ahead_rate(p, st, ahead, level, now)
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
local function priority_cutters(fast, slow, t)
  return slow * t + (fast - slow) * RATE_TAU_S * (1 - math.exp(-t / RATE_TAU_S))
end

-- Walking away depends on how long one has waited: in a sale where everyone who gives up does so in
-- their first twenty seconds, those who have waited a minute stay. The hazard is learnt per band of time
-- waited (HAZARD_BANDS, seconds; hazard_save), and st.thetas holds each band's rate. hazard_curve makes
-- it the cumulative hazard H(a), walk-aways expected of one who has waited a seconds: of those who have
-- waited a, e^-(H(a + s) - H(a)) are still there s seconds later. The bands are narrow in the first
-- minute, where people give up: with 10-30 s as one band, a sale whose walk-aways all came by 20 s took
-- those who had waited half a minute to go on walking away at the 10-30 s rate, and its later bursts
-- were told 0.8 of their waits (bench/RESULTS.md; eleven bands, to 300 s in eight, were no better
-- before the line was learnt from too).
local HAZARD_BANDS = {0, 10, 20, 30, 45, 60, 90, 300}
local HAZARD_NB = #HAZARD_BANDS

-- The numbers of a counter kept as 'x y z' (thetas, hz, hzl, svh, svx, svr), or nil when it holds other than n.
local function numbers(text, n)
  local v = {}
  for x in string.gmatch(text or '', '%S+') do v[#v + 1] = tonumber(x) or 0 end
  if #v ~= n then return nil end
  return v
end

-- The band of x among the bands that start at edges[1 .. nb]: the last to start at or below x (the first,
-- below them all).
local function band_in(edges, nb, x)
  local lo, hi = 1, nb  -- (halving: the holds' curve asks some two thousand times a tick, of 28 bands)
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    if x < edges[mid] then hi = mid - 1 else lo = mid end
  end
  return lo
end

local function band_of(waited)  -- of time waited (walking away)
  return band_in(HAZARD_BANDS, HAZARD_NB, waited)
end

-- A counter's numbers as numbers() reads them.
local function fmt_all(v)
  local out = {}
  for i = 1, #v do out[#out + 1] = string.format('%.6g', v[i]) end
  return table.concat(out, ' ')
end

local function hazard_curve(st)
  local rates = numbers(st.thetas, HAZARD_NB)
  if rates == nil then return nil end
  local at, any = {0}, false  -- at[b]: H at the start of band b
  for b = 1, HAZARD_NB do
    if rates[b] > 0 then any = true end
    if b < HAZARD_NB then at[b + 1] = at[b] + rates[b] * (HAZARD_BANDS[b + 1] - HAZARD_BANDS[b]) end
  end
  if not any then return nil end
  return function(a)
    local b = band_of(a)
    return at[b] + rates[b] * (a - HAZARD_BANDS[b])
  end
end

-- How long ago one who looks present is known to have been there: walking away shows only once the
-- presence timeout has passed since the last sighting, and one who stays was last seen on average half a
-- poll's gap ago (at most the sighting ceiling, selectors.tickets.sighting_ceiling, apart).
local function presence_lag(p)
  local ceiling = math.max(2, math.min(p.presence_timeout / 3, p.claim_ttl / 2))
  return math.max(0, p.presence_timeout - ceiling / 2)
end

-- Of those ahead, the head reaches each in turn over the next t seconds: the one at a share u of the way
-- from the head to this visitor is reached at u t, and has waited what the tick's look found at that
-- place (waits_at_nodes), and was last known to be there presence_lag(p) ago. stay(t) is the
-- share still there when reached, e^-(H(age + u t) - H(age - lag)) (4-point Gauss-Legendre over u: H has
-- few kinks, and the nodes cost four H a step of the bisection).
local GL_U = {0.0694318442, 0.3300094782, 0.6699905218, 0.9305681558}
local GL_W = {0.1739274226, 0.3260725774, 0.3260725774, 0.1739274226}

-- How long the ones at the shares GL_U of the way from the head to this visitor have waited (one pass over
-- the look): the waits the look found, linear between two of them, or the last and this visitor; without a
-- look, linearly from the head to this visitor.
-- Seen in the simulator: a burst joining behind what is left of an earlier one was told 0.73 of its waits,
-- the earlier burst's remainder taken to have waited from half a minute down to nothing, and to walk away
-- at the rates of the first seconds, when all of it had waited half a minute and would stay.
local function waits_at_nodes(look, head_s, own_s, ahead)
  local ages, k, r0, a0 = {}, 1, 0, head_s
  local function fill(r, a)  -- the nodes up to place r, between (r0, a0) and (r, a)
    while k <= 4 and GL_U[k] * ahead <= r do
      ages[k] = r > r0 and a0 + (a - a0) * (GL_U[k] * ahead - r0) / (r - r0) or a
      k = k + 1
    end
    r0, a0 = r, a
  end
  if look then
    local v, since = look.v, look.since
    for i = 3, #v - 3, 4 do
      local r = v[i]
      if r >= ahead or k > 4 then break end
      if r > 0 then fill(r, v[i + 1] + since) end
    end
  end
  fill(math.max(ahead, r0), own_s)
  return ages
end

-- The tick's look at the line (silent_look), as polls read it: 'lj' is a JSON array [tick ms, line length,
-- rank, wait, looked at, silent, ...] of every LOOK_EVERY-th ticket it looked at (12 of 48): its place, its
-- wait, and how many of the tickets looked at up to it there were and how many of them were found silent
-- (JSON: cjson parses it in C, where gmatch took four times as long). Read with those ahead who have not
-- gone silent: the share found silent among the tickets looked at ahead of this visitor, up to the last
-- place ahead (leaning on the line's smoothed share, st.silent, as four looks would); those who joined
-- since the look (past its line's length) all count: none can be silent yet. Seen in the simulator: the
-- back of a burst was told the share of the line before it joined, 0.38 silent, where a third of those
-- ahead were of its own burst; three seconds on, it was told 7 s more. The counts are of 48 tickets, not
-- of the 12 places a poll reads: a share of 12 moved the estimates of a burst joining at once by a quarter
-- from one tick to the next. Returns the look ({v, since}) and those present; raises on a look that is
-- not the tick's (a number of 1e13 or more, NaN, places out of order, counts that fall or more silent than
-- looked at, anything but numbers, not an array of fours), and waits_at_nodes reads no place this has not
-- checked; present_read takes a look that raises as none.
local function line_look(st, now, ahead, s)
  local v = cjson.decode(st.lj)
  local max, seen, silent, before = 1e13, 0, 0, -1
  if type(v) ~= 'table' or #v < 2 or (#v - 2) % 4 ~= 0 or not (v[1] > 0 and v[1] < max and v[2] >= 0 and v[2] < max) then
    error('not a look')
  end
  for i = 3, #v - 3, 4 do
    local n_seen, n_silent = v[i + 2], v[i + 3]
    if not (v[i] > before and v[i + 1] > 0 and v[i + 1] < max and n_seen >= seen and n_seen < max
      and n_silent >= silent and n_silent <= n_seen) then error('not a look') end
    if v[i] >= ahead then break end
    seen, silent, before = n_seen, n_silent, v[i]
  end
  local covered = math.min(ahead, v[2])
  local share = math.min(0.9, (silent + 4 * s) / (seen + 4))
  return {v = v, since = math.max(0, now - v[1]) / 1000}, covered * (1 - share) + (ahead - covered)
end

local function present_read(st, now, ahead, drawn)
  ahead = math.max(0, ahead)
  local s = math.min(0.9, num(st, 'silent', 0))
  if st.lj and drawn then
    local ok, look, present = pcall(line_look, st, now, ahead, s)
    if ok then return present, look end
  end
  return ahead * (1 - s), nil
end

-- still_s: the seconds before the head moves at all (d0 below).
local function hazard_stay(p, st, now, own_s, ahead, look, still_s)
  local H = hazard_curve(st)
  if H == nil then return nil end
  local head_s = math.max(own_s, (now - (tonumber(st.head_js) or now)) / 1000)
  local ages, base = waits_at_nodes(look, head_s, own_s, ahead), {}
  local lag = presence_lag(p)
  for i = 1, 4 do base[i] = H(math.max(0, ages[i] - lag)) end
  return function(t)
    local stay = 0
    local moving = math.max(0, t - still_s)
    for i = 1, 4 do
      local reached = math.min(t, still_s) + GL_U[i] * moving
      stay = stay + GL_W[i] * math.exp(base[i] - H(ages[i] + reached))
    end
    return stay
  end
end

-- Estimated seconds until a visitor with `ahead` tickets in front (of priority `level`, waiting for
-- own_s seconds so far) is admitted, or -1 when unknown (paused or closed). The line drains from its head,
-- where each visitor reached is admitted or, gone (stopped polling: parked; or left), skipped at no cost.
-- Of the `ahead`, the share found silent in the line already (present_read) are gone; each of the others may
-- still walk away while it waits, at the rate of its time waited (hazard_stay), so of those the head
-- reaches over the next t seconds stay(t) are still there: n admissions, this visitor's included. By a
-- time t from now at most B + r_out * t are admitted (the bucket's tokens B, the outflow in force r_out
-- a second) and at most F + the slots back by t (the free slots F; the slots back by the tick's curve,
-- returns_after, or at r_cap = capacity / the mean time a slot is held, once that is known). Priority
-- joiners placed ahead meanwhile add to n (priority_cutters: at the rate they come now, falling back to
-- the sale's). The estimate is the t at which both bounds allow n(t) (bisection; n is never
-- taken as more than twice the walk-free count). Until a slot has been given back once, how long
-- sessions last is not known, and neither is the wait of a visitor who needs more slots than are free:
-- -1, unknown (the queue keeps its record across sales). A site that reports its own count: the
-- observed admission rate stands in for r_cap. A scheduled start adds the time until it.
-- The slots that come back first are looked at one by one (issue 20: a line stalled on an admission
-- nobody claimed was told "less than a minute" at every poll until the claim lapsed, two minutes on). An
-- admission unclaimed for CLAIM_LATE_S is taken to lapse at its deadline (its visitor would have claimed
-- by now: the page hands over at once): the first HEAD_SLOTS of them by a poll (slots_back, one ranged
-- read of the claims), any more by the tick's curve; the other slots come back by the curve.
-- How slots come back when every one is taken (seen in the simulator: a sale's first burst fills the
-- free slots at once, and they come back only after the shortest session, not at capacity / the mean
-- hold from the first second). How long a slot is held is learnt as a rate per band of time held
-- (HOLD_EDGES), the way walking away is: the holds given back in each band ('svh', each one's weight
-- falling by 1/SERVICE_SPAN with every later one) over the slot-seconds spent in it ('svx': the tick
-- adds the time the slots held now spent in each band since its last look, from the ages of HOLD_SAMPLES
-- of them: a claim's score is its admission plus claim_ttl, a session's its admission plus session_ttl;
-- the same fading). Slots still held count too, so early in a sale, when only the shortest holds have
-- come back, the long ones still out are not forgotten (a histogram of the holds given back told the
-- half-walk-away sale a mean hold of 28 s, 55 s in, against 40 s). From those rates the tick works out
-- the mean hold ('svm', what polls take for capacity / r_cap) and how many slots have come back by t
-- (each held slot of age a: P(hold <= a + t | hold > a)), and, for a line that refills each slot as it
-- comes back, those refilled that come back again (the renewal equation, on RETURN_POINTS steps over
-- RETURN_HOLDS mean holds). 'svr': "<tick ms> <step s> R1 .. Rn"; polls read it.
local HOLD_EDGES = {  -- (2-5 s wide up to 30 s, then at most a sixth of where each starts, to 2 minutes)
  0, 5, 10, 12, 15, 17, 20, 23, 26, 30, 35, 40, 45, 52, 60, 70, 80, 90, 105, 120, 150, 180, 240, 300, 450, 600,
  1200, 1800, 3600,
}
local HOLD_NB = #HOLD_EDGES - 1  -- bin b: [HOLD_EDGES[b], HOLD_EDGES[b + 1]) seconds; longer holds in the last
local SERVICE_SPAN, HOLD_SAMPLES, RETURN_POINTS, RETURN_HOLDS = 50, 24, 24, 2
local HOLD_SHRINK = 2  -- a band's rate leans on the curve fitted to all as if HOLD_SHRINK holds had passed through it
local HOLDS_FIRST = 3  -- holds given back before the tick works out the mean hold and the curve of slots back

local function hold_bin(seconds)  -- of time held
  return band_in(HOLD_EDGES, HOLD_NB, seconds)
end

-- The slot-seconds spent in each band by the holds of histogram h, for a queue whose holds were kept
-- before their exposure was: each passed the bands below its own, and half of its own.
local function exposure_of(h)
  local x = {}
  for b = 1, HOLD_NB do x[b] = 0 end
  for b = 1, HOLD_NB do
    for c = 1, b do
      x[c] = x[c] + h[b] * (HOLD_EDGES[c + 1] - HOLD_EDGES[c]) * (c == b and 0.5 or 1)
    end
  end
  return x
end

-- The holds' sums: h (given back per band), x (slot-seconds per band) and when x last grew (ms; 0: never),
-- and whether they were kept in the bands before these (1 s to 5 s wider: a 10 s band at 20-30 s took
-- the holds of sessions of 10-20 s, all back by 21.5 s, to go on to 30 s). Those are read into these,
-- each band's holds and slot-seconds split over the bands it holds by their widths, and the tick's look
-- saves them so (returns_look).
local function hold_sums(svh, svx)
  local h, x = numbers(svh, HOLD_NB), numbers(svx, HOLD_NB + 1)
  local rebanded = false
  if h == nil or x == nil then  -- none yet, or kept in the bands before these
    local was = {0, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 1800, 3600}
    local function into_these(v, from)
      local out = {}
      for b = 1, HOLD_NB do
        out[b] = 0
        for o = 1, #was - 1 do
          local overlap = math.min(was[o + 1], HOLD_EDGES[b + 1]) - math.max(was[o], HOLD_EDGES[b])
          if overlap > 0 then out[b] = out[b] + v[from + o] * overlap / (was[o + 1] - was[o]) end
        end
      end
      return out
    end
    local was_h, was_x = h == nil and numbers(svh, #was - 1), x == nil and numbers(svx, #was)
    if was_h then h, rebanded = into_these(was_h, 0), true end
    if was_x then x, rebanded = {was_x[1], unpack(into_these(was_x, 1))}, true end
  end
  if h == nil then
    h = {}
    for b = 1, HOLD_NB do h[b] = 0 end
  end
  if x == nil then return h, exposure_of(h), 0, rebanded end
  return h, {unpack(x, 2)}, x[1], rebanded
end

-- Adds w slot-seconds for each second of [from, to] (seconds held) to the bands' x.
local function expose(x, from, to, w)
  for b = hold_bin(from), hold_bin(to) do
    local lo, hi = math.max(from, HOLD_EDGES[b]), math.min(to, b < HOLD_NB and HOLD_EDGES[b + 1] or math.huge)
    x[b] = x[b] + w * math.max(0, hi - lo)
  end
end

-- How long an admitted visitor takes to claim its slot is kept apart for the two ways in (session_start.lua):
-- 'cwj', let in at its join (the join's answer hands over at once), and 'cwl', let in from the line (it
-- hears at its next poll or push). A slot let in at a join is held the difference less than one let in
-- from the line, and the record of holds is kept as the line's (service_note, held_ages): the line is
-- what refills the slots. Seen in the simulator: a new queue's burst, let in at its joins, held its slots
-- 15 s against the line's 16.5-17 s, and those waiting behind it were told 1.17 of their waits.
-- claim_shift: that difference (seconds), 0 until a claim from the line has been seen (or begun from the
-- operator's other queues: hold_prior.lua); one at a join is taken to claim at once until one has.
local function claim_shift(cwl, cwj)
  local l = numbers(cwl, 2)
  if l == nil then return 0 end
  local j = numbers(cwj, 2)
  return math.max(0, l[1] - (j and j[1] or 0)) / 1000
end

-- A slot given back after sample_ms, at now: a hold in its band, and the part of it the tick's looks did
-- not see (since the last look, or all of it) to the slot-seconds.
local function hold_note(sample_ms, now)
  local b = redis.call('HMGET', K_ST, 'svh', 'svx')
  local h, x, ts = hold_sums(b[1] or nil, b[2] or nil)
  local seconds = math.max(0, sample_ms / 1000)
  local kept, at = 1 - 1 / SERVICE_SPAN, hold_bin(seconds)
  for i = 1, HOLD_NB do
    h[i] = h[i] * kept + (i == at and 1 or 0)
    x[i] = x[i] * kept
  end
  expose(x, math.max(0, seconds - math.max(0, now - ts) / 1000), seconds, 1)
  redis.call('HSET', K_ST, 'svh', fmt_all(h), 'svx', fmt(ts) .. ' ' .. fmt_all(x))
end

-- S(x), the share of holds not given back within x seconds, and the mean hold (seconds): a life table over
-- the bands. A band's rate r (holds given back in it over its slot-seconds) says the share of those who
-- reach it that are given back in it, r w / (1 + r w / 2) for a band w seconds wide (the actuarial
-- estimate: the holds given back in a band spread across it, as the histogram read them before), and S
-- falls linearly across it. A band with few slot-seconds in it leans on a smooth curve fitted to all of
-- them, as if HOLD_SHRINK holds had passed through it at the curve's rate: a rate a t^c (Weibull's, c
-- found by halving where the holds given back are as old, in the mean of log t, as the slot-seconds
-- weighted by t^c; a where as many are given back as the curve says), so holds older than any seen go on
-- at the pace the shape of those seen points to: a rising one when sessions end within a span (20-60 s:
-- the 14 bands' mean hold read 50-136 s at 25-30 s into a sale, 28 narrower ones 125-414 s, where each
-- band past the last hold given back kept the rate of the band before it), a flat one when they lapse at
-- random. No slot is held longer than its session (or its claim) lasts. nil until HOLDS_FIRST slots have
-- come back: the first say little of the rest (one claim that lapsed at 15 s, 30 s into a sale whose 40
-- slots were all still held, read as a mean hold of 360 s, and the burst joining then was told 2-3.7
-- times its waits); polls take the mean of those given back meanwhile (ema_service_ms).
local function hold_survival(p, h, x)
  local given = 0
  for b = 1, HOLD_NB do given = given + h[b] end
  if given < HOLDS_FIRST - 0.5 then return nil end  -- (each faded by 1/SERVICE_SPAN: three come to 2.94)
  local longest = math.max(p.session_ttl, p.claim_ttl)
  local width, mid, log_mid, old = {}, {}, {}, 0
  for b = 1, HOLD_NB do
    width[b] = (b < HOLD_NB and HOLD_EDGES[b + 1] or math.max(HOLD_EDGES[b + 1], longest)) - HOLD_EDGES[b]
    mid[b] = math.max(1, HOLD_EDGES[b] + width[b] / 2)
    log_mid[b] = math.log(mid[b])
    old = old + h[b] * log_mid[b] / given
  end
  local function tilted(c)  -- the slot-seconds weighted by t^c: their sum, and how much older than the holds
    local w, l = 0, 0
    for b = 1, HOLD_NB do
      local v = x[b] * mid[b] ^ c
      w, l = w + v, l + v * log_mid[b]
    end
    return w, w > 0 and l / w - old or 0
  end
  local lo, hi = -0.5, 3  -- (c: from a falling rate to one that rises as the cube of time held)
  if select(2, tilted(hi)) <= 0 then lo = hi elseif select(2, tilted(lo)) < 0 then
    for _ = 1, 24 do
      local c = (lo + hi) / 2
      if select(2, tilted(c)) < 0 then lo = c else hi = c end
    end
  end
  local c = lo
  local w = tilted(c)
  local a = given / math.max(w, 1e-9)
  local edge, q, mean = {1}, {}, 0
  for b = 1, HOLD_NB do
    local from = HOLD_EDGES[b]
    local k = HOLD_SHRINK * width[b]
    local curve = a * ((from + width[b]) ^ (c + 1) - from ^ (c + 1)) / ((c + 1) * width[b])  -- its mean over the band
    local rw = (h[b] + k * curve) / (x[b] + k) * width[b]
    q[b] = math.min(1, rw / (1 + rw / 2))  -- of the holds that reach the band, the share given back in it
    edge[b + 1] = edge[b] * (1 - q[b])
    local upto = math.min(width[b], longest - from)  -- S falls linearly across the band
    if upto > 0 then mean = mean + upto * edge[b] * (1 - q[b] * upto / width[b] / 2) end
  end
  local function S(t)
    if t >= longest then return 0 end
    local b = hold_bin(t)
    return edge[b] * (1 - q[b] * math.min(1, (t - HOLD_EDGES[b]) / width[b]))
  end
  return S, mean
end

local CLAIM_LATE_S, HEAD_SLOTS = 10, 32
-- The ages (seconds) of up to HOLD_SAMPLES of the slots held now, spread over them, in their order (the
-- claims' scores, then the sessions'), and the same as the line's holds (those let in at a join `shift`
-- seconds older: claim_shift); the count of slots held; how many of the ages (the first) are of the
-- admissions unclaimed for CLAIM_LATE_S that polls look at one by one (slots_back: the first HEAD_SLOTS of
-- them), and how many are of admissions unclaimed that long at all; and the weight of each age past the
-- first of those, which stand for the slots held less the ones looked at one by one.
local function held_ages(p, now, shift)
  local n_claims = redis.call('ZCARD', K_CLAIMS)
  local held = n_claims + redis.call('ZCARD', K_SESSIONS)
  local ages, lines, weight, head, late = {}, {}, 0, 0, 0
  if held > 0 then
    local count = math.min(held, HOLD_SAMPLES)
    local sample = (now % 991) / 991
    local n_late = n_claims > 0 and redis.call('ZCOUNT', K_CLAIMS, '-inf', now + (p.claim_ttl - CLAIM_LATE_S) * 1000) or 0
    local n_head = math.min(n_late, HEAD_SLOTS)
    for i = 0, count - 1 do
      local rank = math.floor((i + sample) * held / count)
      if rank < n_head then head = head + 1 end
      if rank < n_late then late = late + 1 end
      local key, ttl = K_CLAIMS, p.claim_ttl
      if rank >= n_claims then key, ttl, rank = K_SESSIONS, p.session_ttl, rank - n_claims end
      local row = redis.call('ZRANGE', key, rank, rank, 'WITHSCORES')
      if row[2] then
        local age = math.max(0, (now - (tonumber(row[2]) - ttl * 1000)) / 1000)
        local rec = shift > 0 and load(vk_of(row[1])) or nil
        ages[#ages + 1], lines[#lines + 1] = age, age + ((rec and rec[R_ADMITTED] == rec[R_JOINED]) and shift or 0)
      end
    end
    weight = count > head and (held - n_head) / (count - head) or 0
  end
  return ages, lines, held, head, late, weight
end

-- The admission tick's look at the slots held (once a second, on the leader's tick): adds the time they
-- spent in each band since the last look to 'svx', saves the mean hold ('svm'), and draws the curve of
-- slots back ('svr'), the free slots taken as holds begun at this look (by the line's joiners when nobody
-- waits: let in at their joins). It draws one while nobody waits too: a burst into an idle queue fills its
-- slots between two ticks, and until the next one was told that slots come back at capacity / the mean
-- hold from its first second (seen in the simulator: the first in line of a new queue's burst told 2 s,
-- and it had 10 s, the shortest session).
local function returns_look(p, st, now)
  if p.capacity_source == 'reported' then  -- the site counts its sessions: no holds seen here
    if st.svr or st.svm or st.svo then redis.call('HDEL', K_ST, 'svr', 'svm', 'svo') end
    return
  end
  local shift = claim_shift(st.cwl, st.cwj)
  local ages, lines, held, head, late, weight = held_ages(p, now, shift)
  local h, x, ts, rebanded = hold_sums(st.svh, st.svx)
  local since = math.max(0, now - ts) / 1000  -- each slot's seconds since the last look (all, before one)
  if held > 0 then  -- (none held: nothing to add, and every slot held later is seen from its start)
    for i, a in ipairs(lines) do expose(x, a - math.min(since, ages[i]), a, held / #ages) end
    redis.call('HSET', K_ST, 'svx', fmt(now) .. ' ' .. fmt_all(x))
  end
  if rebanded then  -- kept in the bands before these: saved in these
    redis.call('HSET', K_ST, 'svh', fmt_all(h), 'svx', fmt(held > 0 and now or ts) .. ' ' .. fmt_all(x))
  end
  local S, mean_s = hold_survival(p, h, x)
  if S == nil then
    if st.svo then redis.call('HDEL', K_ST, 'svo') end
    return
  end
  local svm = fmt(mean_s * 1000)
  if svm ~= st.svm then redis.call('HSET', K_ST, 'svm', svm) end
  -- A session held far longer than the holds seen (past 98 % of them by the life table, four mean holds
  -- and a minute: `gone_age`) is taken to be held by a visitor who left the site without finishing: it
  -- comes back at its deadline (the session's end), not at the mean's pace, and the curve leaves it out
  -- (polls count it apart: estimate_wait). Seen (issue 47): one slot, holds of 20 s, a visitor who closed
  -- the protected page; the one waiting was told 29 s for the whole 900-s session. 'svo': how many such
  -- sessions are held (counted exactly: sessions are scored by their ends) and when the first one ends.
  local gone_age = math.max(60, 4 * mean_s)
  if S(math.max(gone_age, p.session_ttl)) >= 0.02 then
    gone_age = nil  -- the holds seen run as long as a session may: none is out of the ordinary
  elseif S(gone_age) >= 0.02 then
    local lo, hi = gone_age, math.max(gone_age, p.session_ttl)
    for _ = 1, 16 do
      local mid = (lo + hi) / 2
      if S(mid) < 0.02 then hi = mid else lo = mid end
    end
    gone_age = hi
  end
  local svo = nil
  if gone_age then
    local cutoff = now + (p.session_ttl - gone_age) * 1000
    local first = redis.call('ZRANGEBYSCORE', K_SESSIONS, '-inf', cutoff, 'WITHSCORES', 'LIMIT', 0, 1)
    if first[2] then
      svo = redis.call('ZCOUNT', K_SESSIONS, '-inf', cutoff) .. ' ' .. fmt(tonumber(first[2]))
    end
  end
  if svo ~= st.svo then
    if svo then redis.call('HSET', K_ST, 'svo', svo) else redis.call('HDEL', K_ST, 'svo') end
  end
  local function abandoned(i)  -- (an age past gone_age is a session's: claims that old are the late ones)
    return gone_age ~= nil and i > late and ages[i] >= gone_age
  end
  local free = math.max(0, p.capacity - held)  -- filled at once by the line: holders of age 0
  if mean_s <= 0 then
    if st.svr then redis.call('HDEL', K_ST, 'svr') end
    return
  end
  local function F(a) return 1 - S(a) end
  local step = RETURN_HOLDS * mean_s / RETURN_POINTS
  local function gone(a, t)  -- a slot held for a seconds: the chance it is back within t more
    local left = S(a)
    if left < 0.02 then return 1 - math.exp(-t / mean_s) end  -- older than the holds seen: at the mean's pace
    return math.min(1, (left - S(a + t)) / left)
  end
  local fill = line_count() > 0 and 0 or shift  -- the free slots' age as the line's holds
  local first, f = {}, {}  -- first[k]: back by k steps, of those held now; f[k]: a fresh hold's, in step k
  for k = 1, RETURN_POINTS do
    local t, sum = k * step, free * gone(fill, k * step)
    for i = head + 1, #ages do  -- (the first HEAD_SLOTS late: slots_back)
      -- an admission unclaimed for CLAIM_LATE_S lapses at its deadline, like those slots_back looks at; a
      -- session held by one who left (above) is counted apart
      if i <= late then
        sum = sum + weight * (t >= p.claim_ttl - ages[i] and 1 or 0)
      elseif not abandoned(i) then
        sum = sum + weight * gone(lines[i], t)
      end
    end
    first[k] = sum
    f[k] = F(k * step) - F((k - 1) * step)
  end
  local r, total, out = {}, 0, {fmt(now), string.format('%.4g', step)}
  for k = 1, RETURN_POINTS do
    local rate = first[k] - (first[k - 1] or 0)
    for j = 1, k - 1 do rate = rate + r[j] * f[k - j] end  -- refilled at step j, back in k - j steps
    r[k] = rate
    total = total + rate
    out[#out + 1] = string.format('%.4g', total)
  end
  redis.call('HSET', K_ST, 'svr', table.concat(out, ' '))
end

-- Seconds from now until k slots have come back, by the tick's curve (past its end, at the pace r_cap);
-- nil when there is none. The curve never falls: the first of its points at k or more, found by halving.
local function returns_after(v, now, k, r_cap)
  if v == nil then return nil end
  local since, step = (now - v[1]) / 1000, v[2]
  if v[RETURN_POINTS + 2] < k then
    return math.max(0, RETURN_POINTS * step + (k - v[RETURN_POINTS + 2]) / r_cap - since)
  end
  local lo, hi = 1, RETURN_POINTS
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if v[mid + 2] >= k then hi = mid else lo = mid + 1 end
  end
  local back, before = v[lo + 2], lo > 1 and v[lo + 1] or 0
  local share = back > before and (k - before) / (back - before) or 1
  return math.max(0, (lo - 1 + share) * step - since)
end

-- Seconds until k slots are back near the head: the first HEAD_SLOTS admissions unclaimed for CLAIM_LATE_S
-- (the claims' lowest scores) at their deadlines, the other slots by the tick's curve (returns_after: it
-- counts the late ones past HEAD_SLOTS at their deadlines too) or, without one, at the pace r_cap for
-- their share of the capacity. nil: no late admission (the curve or the pace alone).
local function slots_back(p, now, r_cap, curve)
  local cutoff = now + (p.claim_ttl - CLAIM_LATE_S) * 1000
  local rows = redis.call('ZRANGEBYSCORE', K_CLAIMS, '-inf', cutoff, 'WITHSCORES', 'LIMIT', 0, HEAD_SLOTS)
  if #rows == 0 then return nil end
  local late = {}
  for i = 2, #rows, 2 do late[#late + 1] = math.max(0, (tonumber(rows[i]) - now) / 1000) end
  local share = math.max(0, p.capacity - #late) / p.capacity
  local function others(j)  -- seconds until j of the other slots are back: the tick's curve, or the pace
    if j <= 0 then return 0 end
    if share <= 0 then return math.huge end
    return returns_after(curve, now, j, r_cap) or j / (r_cap * share)
  end
  -- Back by t: the first i late admissions at their deadlines and k - i of the others, the least over i of
  -- max(late[i], others(k - i)), where the deadlines (rising with i) cross the others (falling): found by
  -- halving (a poll's bisection asks this some sixteen times).
  return function(k)
    local lo, hi = 1, math.min(#late, math.ceil(k))
    local first = hi + 1  -- the least i with late[i] >= others(k - i)
    while lo <= hi do
      local mid = math.floor((lo + hi) / 2)
      if late[mid] >= others(k - mid) then first, hi = mid, mid - 1 else lo = mid + 1 end
    end
    local best = others(k - first + 1)
    if late[first] and late[first] < best then best = late[first] end
    if best == math.huge then return late[#late] + (k - #late) / r_cap end  -- every slot was a late one
    return best
  end
end

local function estimate_wait(p, st, ahead, now, used, level, own_s)
  if p.state ~= 'open' then return -1 end
  local until_start = math.max(0, p.starts_at_ms - now) / 1000
  local r_out = p.outflow / 60
  if r_out <= 0 then return -1 end
  -- (before a shuffled start's draw those ahead will be any of the line, not the look's first places)
  local present, look = present_read(st, now, ahead, not (p.shuffle_pending and now < p.starts_at_ms))
  local tokens = math.max(0, whole_tokens((bucket_tokens(p, st, math.max(now, p.starts_at_ms)))))
  local free = math.max(0, capacity_now(p, st, now) - (used or used_slots(p, st)))
  local r_cap = nil
  local service_ms = num(st, 'ema_service_ms', 0)
  if service_ms > 0 then
    service_ms = num(st, 'svm', service_ms)  -- the mean hold by the bands' rates, slots still held counted
    r_cap = p.capacity / (service_ms / 1000)
  elseif p.capacity_source == 'reported' and num(st, 'ema_ts', 0) > 0 then
    -- the site counts its own sessions, so their length is never seen here: the observed pace
    local age_s = math.max(0, now - num(st, 'ema_ts', 0)) / 1000
    r_cap = num(st, 'ema_rate', 0) * math.exp(-age_s / RATE_TAU_S)
  end
  local back, curve, r_live, gone_n, gone_end = nil, nil, r_cap, 0, 0
  if r_cap ~= nil and r_cap > 0 and 2 * (present + 1) > free then
    curve = numbers(st.svr, RETURN_POINTS + 2)
    -- slots held by visitors taken to have left (returns_look: 'svo') come back at their deadlines, the
    -- first at gone_end; the rest of the site turns over at its pace
    local svo = numbers(st.svo, 2)
    if svo and p.capacity > 0 then
      gone_n, gone_end = svo[1], math.max(0, svo[2] - now) / 1000
      r_live = r_cap * math.max(0, p.capacity - gone_n) / p.capacity
    end
    back = slots_back(p, now, r_live, curve)
  end
  local function base(k)  -- seconds until k slots are back, of those held by visitors still there
    if k <= 0 then return 0 end
    if back then return back(k) end
    if r_live > 0 then return returns_after(curve, now, k, r_live) or k / r_live end
    return math.huge
  end
  local function returns(k)  -- and the first slot held by one who left, back at its end (then turning over)
    local t = base(k)
    if gone_n > 0 then
      local rest = r_live > 0 and base(k - 1) or gone_end + math.max(0, k - 1) * p.capacity / r_cap
      t = math.min(t, math.max(gone_end, rest))
    end
    return t
  end
  local function drained(n)  -- seconds until n admissions are allowed; nil: unknown
    local t = (n - tokens) / r_out
    if n > free then  -- this visitor needs a slot that is not free yet: when do slots come back?
      if r_cap == nil or r_cap <= 0 then return nil end  -- no slot has come back yet: nobody can know
      t = math.max(t, returns(n - free))
      if t == math.huge then return nil end
    end
    return math.max(0, t)
  end
  local t = drained(present + 1)
  if t == nil then return -1 end
  local stay = nil
  if present > 0 then
    -- When the head reaches those ahead: the one a share u of the way once the line has stood still until
    -- the first admission it allows (d0: a free slot or token at once; a burst that has filled every slot,
    -- not before the first slot comes back) and then moved u of the rest of the wait, at an even pace.
    -- Seen in the simulator's capacity-bound sale (a new queue, 15 % walking away 3-40 s after joining):
    -- taken to move at an even pace from the join, the head was to reach most of those ahead before they
    -- walked away, where it stood still 10 s for the shortest session and they had that much longer to go,
    -- and the burst was told 1.2 of its waits.
    stay = hazard_stay(p, st, now, math.max(0, own_s or 0), ahead, look, drained(1) or 0)
  end
  local cutting, cutting_slow = priority_ahead_rate(p, st, ahead, level or 0, now)
  if stay ~= nil or cutting > 0 or cutting_slow > 0 then
    local cap = 2 * (present + 1)
    if r_cap == nil or r_cap <= 0 then cap = math.min(cap, free) end  -- known only within the free slots
    local function admissions(t)  -- n(t): those ahead still there when reached, cutters, and itself
      return math.min(cap, (present + priority_cutters(cutting, cutting_slow, t)) * (stay and stay(t) or 1) + 1)
    end
    local lo, hi = 0, drained(cap)
    for _ = 1, 14 do  -- drained(n(t)) - t falls from >= 0 at 0 to <= 0 at hi
      t = (lo + hi) / 2
      if drained(admissions(t)) > t then lo = t else hi = t end
    end
    t = (lo + hi) / 2
  end
  return math.ceil(until_start + t + TICK_S / 2)  -- admissions come with the next tick
end

-- How far waits fall from what was told: w_lo and w_hi follow the 10th and 90th percentiles of
-- ln(wait had / wait told at the join) over the queue's admissions (a stochastic quantile estimate: one
-- step per admission, bounded memory). A step is WAIT_STEP of the range's width, so a queue whose waits
-- come out close to what was told gets a range that close, not one a fixed step wide (at 0.08 a step, a
-- steady sale's range held 95 % of its waits, not 80 %). The API's estimated_wait_range is the estimate
-- times e^w_lo .. e^w_hi. Until a queue has a record, a wide range: 0.7 to 1.4 times.
-- Returns true when admission stopped while it waited (a pause, a close: off_ms, opened_note), which
-- lengthened its wait by a spell no estimate could foresee: its sample says so (the dashboard and the
-- simulator leave such waits out of the estimate's error).
local function wait_learn(rec, now)
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
local function opened_note(p, st, now)
  if admitting(p, now) then
    if st.adm_off then
      redis.call('HSET', K_ST, 'opened_ms', now, 'off_ms', tonumber(st.adm_off) or 0)
      redis.call('HDEL', K_ST, 'adm_off')
    end
  elseif not st.adm_off then  -- (before a scheduled start: foreseen, the estimate counts the time until it)
    redis.call('HSET', K_ST, 'adm_off', now < p.starts_at_ms and 0 or now)
  end
end

-- The estimate a waiting visitor is told: before a scheduled start's draw its place is not known yet, so
-- the estimate is for the middle of the pre-queue as it will be at the start (the API gives the range over
-- the draw): it grows until then at the pace it has grown since it opened (over at least PREQUEUE_PACE_S,
-- so that its first seconds do not make a crowd of a handful). Seen in the simulator: counting only those
-- in it so far, the first to join were told the wait of the middle of seven, and had the wait of a place
-- among sixty.
local PREQUEUE_PACE_S = 10
local function estimate_told(p, st, level, rank, now, used, joined)
  local own_s = (now - (joined or now)) / 1000
  if p.shuffle_pending and now < p.starts_at_ms then
    local n = line_count()
    if p.prequeue_opens_ms > 0 and now > p.prequeue_opens_ms then
      local open_s = math.max(PREQUEUE_PACE_S, (now - p.prequeue_opens_ms) / 1000)
      n = n + n / open_s * (p.starts_at_ms - now) / 1000
    end
    return estimate_wait(p, st, (n - 1) / 2, now, used, level, own_s)
  end
  return estimate_wait(p, st, rank, now, used, level, own_s)
end

-- Walking away as a rate (Ibrahim & Whitt's delay predictors with abandonment), per band of time waited:
-- from the departures at the head, the maximum-likelihood rate of a hazard constant within each band.
-- One skipped there walked away after (last seen - joined) seconds of waiting; one admitted waited
-- (now - joined) and did not; one admitted who then let its claim lapse had walked away too (counted when
-- it lapses: hazard_lapsed). Each departure adds its seconds to the bands its wait crossed, and its walk to
-- the band it walked in. Sums over the last ~HAZARD_SPAN departures (each one's weight falls by
-- 1/HAZARD_SPAN with every later one), from a prior of HAZARD_PRIOR departures of HAZARD_PRIOR_S seconds
-- each in which nobody walked away: a new queue learns from its first departures without one walk-away
-- making everyone a walk-away, and a queue keeps its record across sales. A band with few seconds in it
-- leans on the band before it (the first, on the rate over all bands, theta, by HAZARD_SHRINK_S): (walks +
-- K rate before) / (seconds + K), so waits longer than any seen yet go on as the longest seen did. K is the
-- waiting in which HAZARD_LEAN.walks walks would be seen at the rate before (at least HAZARD_SHRINK_S, at
-- most HAZARD_LEAN.max_s):
-- a band in which nobody has been seen to walk away yet is not taken as one where nobody does until its
-- waiting says so. Seen in the simulator's forty-percent sale (walks 3-40 s after joining), 40 s in: the
-- band of 20-30 s had 118 s of waiting in it and no walk yet (1.5 were to be expected), and a fixed K of
-- 30 s took its rate as a fifth of the band before; the burst joining then was told 1.17 of its waits.
-- 'hz' holds the sums ('walks seconds' per band); 'thetas', the bands' rates, is what polls read; 'theta'
-- is the overall rate. The head learns late: it meets a burst's walk-aways only once it reaches them (in
-- the simulator's forty-percent sale, 36 s in, the rates were a tenth of the walk-aways' own). So the tick's
-- look at the line learns too (silent_look, 'hzl': the same sums, fading by LINE_KEPT a look), and the
-- rates are taken from both.
local HAZARD_SPAN, HAZARD_PRIOR, HAZARD_PRIOR_S, HAZARD_SHRINK_S = 50, 5, 20, 30
local HAZARD_LEAN = {walks = 1.5, max_s = 600}

local function band_seconds(b, waited)  -- of a wait of `waited` seconds, those spent in band b
  return math.max(0, math.min(waited, HAZARD_BANDS[b + 1] or waited) - HAZARD_BANDS[b])
end

-- Sums kept over the bands before these (0-10-30-90-300 s), spread over these by the seconds they share:
-- a queue learnt before an upgrade keeps its record.
local OLD_BANDS = {0, 10, 30, 90, 300}
local function sums_moved(text)
  local old = numbers(text, 2 * #OLD_BANDS)
  if old == nil then return nil end
  local h = {}
  for b = 1, HAZARD_NB do
    h[2 * b - 1], h[2 * b] = 0, 0
    local lo, hi = HAZARD_BANDS[b], HAZARD_BANDS[b + 1] or math.huge
    for o = 1, #OLD_BANDS do
      local o_lo, o_hi = OLD_BANDS[o], OLD_BANDS[o + 1] or math.huge
      local shared = math.min(hi, o_hi) - math.max(lo, o_lo)
      if shared > 0 then
        local part = o_hi == math.huge and 1 or shared / (o_hi - o_lo)
        h[2 * b - 1], h[2 * b] = h[2 * b - 1] + old[2 * o - 1] * part, h[2 * b] + old[2 * o] * part
      end
    end
  end
  return h
end

local function hazard_load(st)
  local h = numbers(st.hz, 2 * HAZARD_NB) or sums_moved(st.hz)
  if h then return h end
  h = {}  -- nothing learnt yet (or the sums of one rate for every wait, before the bands): the prior
  for b = 1, HAZARD_NB do h[2 * b - 1], h[2 * b] = 0, HAZARD_PRIOR * band_seconds(b, HAZARD_PRIOR_S) end
  return h
end

local function hazard_stored()  -- hazard_load, for a script that has not read the queue's counters
  return hazard_load({hz = redis.call('HGET', K_ST, 'hz') or nil})
end

-- Adds one wait of `seconds` to sums in hz's form: its seconds to the bands it crossed, its walk (walked 1) to
-- the band it walked in.
local function sums_note(hl, walked, seconds, w)
  seconds, w = math.max(0, seconds), w or 1
  for b = 1, HAZARD_NB do hl[2 * b] = hl[2 * b] + w * band_seconds(b, seconds) end
  if walked > 0 then
    local b = band_of(seconds)
    hl[2 * b - 1] = hl[2 * b - 1] + w * walked
  end
end

local function hazard_note(h, walked, seconds)
  local kept = 1 - 1 / HAZARD_SPAN
  for i = 1, 2 * HAZARD_NB do h[i] = h[i] * kept end
  sums_note(h, walked, seconds)
  return h
end

-- The line's sums (silent_look), in the same form as the head's: {} when there are none.
local function hazard_line(hzl)
  return numbers(hzl, 2 * HAZARD_NB) or sums_moved(hzl) or {}
end

-- Saves the head's sums h, and the bands' rates from them and the line's sums hl (read when not given).
local function hazard_save(h, hl)
  hl = hl or hazard_line(redis.call('HGET', K_ST, 'hzl') or nil)
  local all = {}
  for i = 1, 2 * HAZARD_NB do all[i] = h[i] + (hl[i] or 0) end
  local walks, secs = 0, 0
  for b = 1, HAZARD_NB do walks, secs = walks + all[2 * b - 1], secs + all[2 * b] end
  local theta = walks / math.max(1, secs)
  local sums, rates, before = {}, {}, theta
  for b = 1, HAZARD_NB do
    sums[2 * b - 1], sums[2 * b] = string.format('%.6g', h[2 * b - 1]), string.format('%.6g', h[2 * b])
    local k = b == 1 and HAZARD_SHRINK_S
      or math.min(HAZARD_LEAN.max_s, math.max(HAZARD_SHRINK_S, HAZARD_LEAN.walks / math.max(before, 1e-9)))
    before = (all[2 * b - 1] + k * before) / (all[2 * b] + k)
    rates[b] = string.format('%.4g', before)
  end
  redis.call('HSET', K_ST, 'hz', table.concat(sums, ' '), 'thetas', table.concat(rates, ' '), 'theta', fmt(theta))
end

-- How long a departure at the head had waited (seconds), and for one skipped, until it was last seen.
local function waited_s(rec, now, walked)
  if walked then return rec[R_SEEN] - rec[R_JOINED] / 1000 end
  return (now - rec[R_JOINED]) / 1000
end

local function hazard_lapsed(h, ages)  -- walks only: their seconds were counted when they were admitted
  for _, waited in ipairs(ages) do
    local b = band_of(math.max(0, waited))
    h[2 * b - 1] = h[2 * b - 1] + 1
  end
  return h
end

-- Who has gone silent in the line already, before the head reaches them: the share of SILENT_SAMPLES
-- tickets, spread over the line, not seen within the presence timeout (the admission tick looks, once a
-- second; st.silent, lightly smoothed). Walking away shows here a presence timeout after it happens, long
-- before the head gets there: estimate_wait counts those as gone, and the others at the rate of their
-- time waited. The look notes when the head joined too (head_js: hazard_stay's oldest wait ahead), and
-- adds what each ticket it looks at says of walking away to the line's sums ('hzl'): a silent one walked
-- away after its wait to its last sighting; any other stayed at least until a presence timeout ago (a walk
-- since would not show yet), the tickets looked at weighing LINE_WEIGHT in all (the line's weight against
-- the head's as when a look was of 24), or one each in a shorter line. The sums fade by LINE_KEPT a look,
-- and are dropped once faded below LINE_FADED (the line has been empty a while): they speak for the line
-- as it is now. What polls read of it: 'lj' (line_look).
local SILENT_SAMPLES, LOOK_EVERY = 48, 4
local LINE_KEPT, LINE_FADED, LINE_WEIGHT = 0.9, 0.01, 24
local function silent_look(p, st, now, h)  -- h: the head's sums as the tick left them; saved here
  local n = line_count()
  local seen, silent, head_js, waits = 0, 0, now, {}
  local hl, any = hazard_line(st.hzl), false
  for i = 1, #hl do hl[i] = hl[i] * LINE_KEPT end
  if #hl == 0 then for i = 1, 2 * HAZARD_NB do hl[i] = 0 end end
  if n > 0 then
    local head = line_range(0, 0)
    local first = head[1] and load(vk_of(head[1]))
    if first then head_js = first[R_JOINED] end
    local present_since = math.floor(now / 1000) - p.presence_timeout
    local shift = (now % 997) / 997
    local count = math.min(n, SILENT_SAMPLES)
    local w = math.min(LINE_WEIGHT, count) / count
    for i = 0, count - 1 do
      local rank = math.floor((i + shift) * n / count)
      local batch = line_range(rank, rank)
      local rec = batch[1] and load(vk_of(batch[1]))
      if rec and rec[R_STATUS] == WAITING then
        seen = seen + 1
        local joined_s = rec[R_JOINED] / 1000
        if rec[R_SEEN] < present_since then  -- walked away after its wait to its last sighting
          silent = silent + 1
          sums_note(hl, 1, rec[R_SEEN] - joined_s, w)
        else  -- stayed at least until the presence timeout ago: a walk since would not show yet
          sums_note(hl, 0, present_since - joined_s, w)
        end
        if i % LOOK_EVERY == LOOK_EVERY - 1 or i == count - 1 then  -- what polls read (line_look)
          local wait = math.floor(math.max(1, now / 100 - joined_s * 10) + 0.5) / 10  -- 0.1 s, never 0
          waits[#waits + 1], waits[#waits + 2], waits[#waits + 3], waits[#waits + 4] = rank, wait, seen, silent
        end
      end
    end
  end
  for i = 1, #hl do any = any or hl[i] > LINE_FADED end
  local share = seen > 0 and silent / seen or 0
  local old = tonumber(st.silent) or share
  redis.call('HSET', K_ST, 'silent', fmt(old * 0.5 + share * 0.5), 'head_js', head_js,
    'lj', '[' .. fmt(now) .. ',' .. n .. (#waits > 0 and ',' or '') .. table.concat(waits, ',') .. ']')
  if any then
    redis.call('HSET', K_ST, 'hzl', fmt_all(hl))
  else
    hl = {}
    redis.call('HDEL', K_ST, 'hzl')
  end
  hazard_save(h, hl)
end
