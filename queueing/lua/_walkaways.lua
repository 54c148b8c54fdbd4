-- _walkaways.lua: walking away as a hazard by time waited, learnt from the departures at the head and
-- from the tick's look at the line, and how many of those ahead a wait expects to stay (part of the
-- library: _lib.lua; used by the estimate, _estimates.lua). Issue 18.
--!exports: HAZARD_NB present_read hazard_stay hazard_load hazard_stored hazard_note hazard_save waited_s
--!exports: hazard_lapsed silent_look look_forgotten

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
HAZARD_NB = #HAZARD_BANDS

local function band_of(waited)  -- of time waited (walking away)
  return band_in(HAZARD_BANDS, HAZARD_NB, waited)
end

-- Texts decoded, kept by their text: the tick's table works a wait out at a few dozen places, and the polls
-- of a second read the same texts (at most KEPT_MAX of each kind kept; none is changed once decoded).
local KEPT_MAX = 64
local function kept(cache, text, decode)
  local v = cache.of[text]
  if v == nil then
    v = decode(text)
    if cache.n >= KEPT_MAX then cache.of, cache.n = {}, 0 end
    cache.of[text], cache.n = v, cache.n + 1
  end
  return v
end

local CURVES, LOOKS = {of = {}, n = 0}, {of = {}, n = 0}

local function hazard_curve_of(text)
  local rates = numbers(text, HAZARD_NB)
  if rates == nil then return false end
  local at, any = {0}, false  -- at[b]: H at the start of band b
  for b = 1, HAZARD_NB do
    if rates[b] > 0 then any = true end
    if b < HAZARD_NB then at[b + 1] = at[b] + rates[b] * (HAZARD_BANDS[b + 1] - HAZARD_BANDS[b]) end
  end
  if not any then return false end
  return function(a)
    local b = band_in(HAZARD_BANDS, HAZARD_NB, a)  -- (band_of's, a call fewer: four a step of a bisection)
    return at[b] + rates[b] * (a - HAZARD_BANDS[b])
  end
end

local function hazard_curve(st)
  if not st.thetas then return nil end
  return kept(CURVES, st.thetas, hazard_curve_of) or nil
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
    local v, since, moved = look.v, look.since, look.moved
    for i = 3, #v - 3, 4 do
      local r = v[i] - moved  -- (its place now: those ahead of it that left the line since the look)
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
  local v = kept(LOOKS, st.lj, cjson.decode)
  local max, seen, silent, before = 1e13, 0, 0, -1
  if type(v) ~= 'table' or #v < 2 or (#v - 2) % 4 ~= 0 or not (v[1] > 0 and v[1] < max and v[2] >= 0 and v[2] < max) then
    error('not a look')
  end
  -- those taken out of the line at its head since the look (admitted, parked: 'wto', admit.lua): each place
  -- looked at is that many nearer the head now, and those it counted before them are gone
  local moved, gone_seen, gone_silent = math.max(0, tonumber(st.wto) or 0), 0, 0
  for i = 3, #v - 3, 4 do
    local n_seen, n_silent = v[i + 2], v[i + 3]
    if not (v[i] > before and v[i + 1] > 0 and v[i + 1] < max and n_seen >= seen and n_seen < max
      and n_silent >= silent and n_silent <= n_seen) then error('not a look') end
    if v[i] - moved >= ahead then break end
    seen, silent, before = n_seen, n_silent, v[i]
    if v[i] < moved then gone_seen, gone_silent = n_seen, n_silent end
  end
  seen, silent = seen - gone_seen, silent - gone_silent
  local covered = math.max(0, math.min(ahead, v[2] - moved))
  local share = math.min(0.9, (silent + 4 * s) / (seen + 4))
  return {v = v, since = math.max(0, now - v[1]) / 1000, moved = moved}, covered * (1 - share) + (ahead - covered)
end

function present_read(st, now, ahead, drawn)
  ahead = math.max(0, ahead)
  local s = math.min(0.9, num(st, 'silent', 0))
  if st.lj and drawn then
    local ok, look, present = pcall(line_look, st, now, ahead, s)
    if ok then return present, look end
  end
  return ahead * (1 - s), nil
end

-- still_s: the seconds before the head moves at all (d0 below).
function hazard_stay(p, st, now, own_s, ahead, look, still_s)
  local H = hazard_curve(st)
  if H == nil then return nil end
  local head_s = math.max(own_s, (now - (tonumber(st.head_js) or now)) / 1000)
  local ages, base = waits_at_nodes(look, head_s, own_s, ahead), {}
  local lag = presence_lag(p)
  for i = 1, 4 do base[i] = H(math.max(0, ages[i] - lag)) end
  local exp = math.exp
  return function(t)  -- (asked at every step of every bisection: math.min and math.max written out)
    local stay, moving, still = 0, t - still_s, t
    if not (moving > 0) then moving = 0 end
    if still_s < still then still = still_s end
    for i = 1, 4 do
      stay = stay + GL_W[i] * exp(base[i] - H(ages[i] + (still + GL_U[i] * moving)))
    end
    return stay
  end
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

function hazard_load(st)
  local h = numbers(st.hz, 2 * HAZARD_NB) or sums_moved(st.hz)
  if h then return h end
  h = {}  -- nothing learnt yet (or the sums of one rate for every wait, before the bands): the prior
  for b = 1, HAZARD_NB do h[2 * b - 1], h[2 * b] = 0, HAZARD_PRIOR * band_seconds(b, HAZARD_PRIOR_S) end
  return h
end

function hazard_stored()  -- hazard_load, for a script that has not read the queue's counters
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

function hazard_note(h, walked, seconds)
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
function hazard_save(h, hl)
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
function waited_s(rec, now, walked)
  if walked then return rec[R_SEEN] - rec[R_JOINED] / 1000 end
  return (now - rec[R_JOINED]) / 1000
end

function hazard_lapsed(h, ages)  -- walks only: their seconds were counted when they were admitted
  for _, waited in ipairs(ages) do
    local b = band_of(math.max(0, waited))
    h[2 * b - 1] = h[2 * b - 1] + 1
  end
  return h
end

-- Who has gone silent in the line already, before the head reaches them: the share of SILENT_SAMPLES
-- tickets, spread over the line, not seen within the presence timeout (the leader's tick looks, every few
-- second; st.silent, lightly smoothed). Walking away shows here a presence timeout after it happens, long
-- before the head gets there: estimate_wait counts those as gone, and the others at the rate of their
-- time waited. The look notes when the head joined too (head_js: hazard_stay's oldest wait ahead), and
-- adds what each ticket it looks at says of walking away to the line's sums ('hzl'): a silent one walked
-- away after its wait to its last sighting; any other stayed at least until a presence timeout ago (a walk
-- since would not show yet), the tickets looked at weighing LINE_WEIGHT in all (the line's weight against
-- the head's as when a look was of 24), or one each in a shorter line. The sums fade by LINE_KEPT a second,
-- and are dropped once faded below LINE_FADED (the line has been empty a while): they speak for the line
-- as it is now. What polls read of it: 'lj' (line_look).
local SILENT_SAMPLES, LOOK_EVERY = 48, 4
local LINE_KEPT, LINE_FADED, LINE_WEIGHT, SILENT_KEPT = 0.9, 0.01, 24, 0.5
function silent_look(p, st, now, h, dt, stands)  -- h: the head's sums as the tick left them; saved here
  local n = line_count()
  local seen, silent, head_js, waits = 0, 0, now, {}
  local hl, any = hazard_line(st.hzl), false
  -- dt: the seconds since the last look (_estimates.lua model_tick, every few), the sums fading by LINE_KEPT
  -- a second; a look weighs what the looks of those seconds would have, in all, up to `stands` seconds'
  -- (after a longer gap it is one look at a line that has changed meanwhile, not the many it replaces)
  local kept, weight = LINE_KEPT ^ dt, (1 - LINE_KEPT ^ math.min(dt, stands)) / (1 - LINE_KEPT)
  for i = 1, #hl do hl[i] = hl[i] * kept end
  if #hl == 0 then for i = 1, 2 * HAZARD_NB do hl[i] = 0 end end
  if n > 0 then
    local head = line_range(0, 0)
    local first = head[1] and load(vk_of(head[1]))
    if first then head_js = first[R_JOINED] end
    local present_since = math.floor(now / 1000) - p.presence_timeout
    local shift = (now % 997) / 997
    local count = math.min(n, SILENT_SAMPLES)
    local w = math.min(LINE_WEIGHT, count) / count * weight
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
  local old, stays = tonumber(st.silent) or share, SILENT_KEPT ^ dt  -- (lightly smoothed: halved a second)
  redis.call('HSET', K_ST, 'silent', fmt(old * stays + share * (1 - stays)), 'head_js', head_js, 'wto', 0,
    'lj', '[' .. fmt(now) .. ',' .. n .. (#waits > 0 and ',' or '') .. table.concat(waits, ',') .. ']')
  if any then
    redis.call('HSET', K_ST, 'hzl', fmt_all(hl))
  else
    hl = {}
    redis.call('HDEL', K_ST, 'hzl')
  end
  hazard_save(h, hl)
end

-- The look at a line nobody is in, as looks at it each second leave it once the line's walk-away sums have
-- faded out (idle.lua waits for that): no look, no head, nobody silent.
function look_forgotten()
  redis.call('HDEL', K_ST, 'lj', 'head_js')
  redis.call('HSET', K_ST, 'silent', '0')
end
