-- _holds.lua: how long admitted visitors hold their slots, learnt per band of time held, and when the
-- slots held now come back (part of the library: _lib.lua; used by the estimate, _estimates.lua). Issue 18
-- and 20.
--!exports: HOLD_NB SERVICE_SPAN RETURN_POINTS claim_shift hold_note returns_look returns_after slots_back

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
HOLD_NB = #HOLD_EDGES - 1  -- bin b: [HOLD_EDGES[b], HOLD_EDGES[b + 1]) seconds; longer holds in the last
SERVICE_SPAN = 50
RETURN_POINTS = 24
local HOLD_SAMPLES, RETURN_HOLDS = 24, 2
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
function claim_shift(cwl, cwj)
  local l = numbers(cwl, 2)
  if l == nil then return 0 end
  local j = numbers(cwj, 2)
  return math.max(0, l[1] - (j and j[1] or 0)) / 1000
end

-- A slot given back after sample_ms, at now: a hold in its band, and the part of it the tick's looks did
-- not see (since the last look, or all of it) to the slot-seconds.
function hold_note(sample_ms, now)
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
-- and it had 10 s, the shortest session). `idle`: drawn for an empty house the ticks leave alone (idle.lua),
-- stamped 0 for "whenever it is read" (lua/_estimates.lua slots_model).
function returns_look(p, st, now, idle)
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
  local r, total, out = {}, 0, {idle and '0' or fmt(now), string.format('%.4g', step)}
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
function returns_after(v, now, k, r_cap)
  if v == nil then return nil end
  local since, step = (now - v[1]) / 1000, v[2]
  local t
  if v[RETURN_POINTS + 2] < k then
    t = RETURN_POINTS * step + (k - v[RETURN_POINTS + 2]) / r_cap - since
  else
    local lo, hi = 1, RETURN_POINTS
    while lo < hi do
      local mid = lo + hi
      mid = (mid - mid % 2) / 2  -- math.floor(mid / 2) of a whole number, without a call
      if v[mid + 2] >= k then hi = mid else lo = mid + 1 end
    end
    local back, before = v[lo + 2], lo > 1 and v[lo + 1] or 0
    local share = back > before and (k - before) / (back - before) or 1
    t = (lo - 1 + share) * step - since
  end
  if t > 0 then return t end  -- (math.max(0, t) written out: every step of a bisection asks)
  return 0
end

-- Seconds until k slots are back near the head: the first HEAD_SLOTS admissions unclaimed for CLAIM_LATE_S
-- (the claims' lowest scores) at their deadlines, the other slots by the tick's curve (returns_after: it
-- counts the late ones past HEAD_SLOTS at their deadlines too) or, without one, at the pace r_cap for
-- their share of the capacity. nil: no late admission (the curve or the pace alone).
function slots_back(p, now, r_cap, curve)
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
      local mid = lo + hi
      mid = (mid - mid % 2) / 2  -- (math.floor of a whole number's half, without a call)
      if late[mid] >= others(k - mid) then first, hi = mid, mid - 1 else lo = mid + 1 end
    end
    local best = others(k - first + 1)
    if late[first] and late[first] < best then best = late[first] end
    if best == math.huge then return late[#late] + (k - #late) / r_cap end  -- every slot was a late one
    return best
  end
end
