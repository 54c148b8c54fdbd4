-- _estimates.lua: the wait a visitor is told, from the line's drain (priority joiners, _priority.lua;
-- walking away, _walkaways.lua; the slots that come back, _holds.lua), and the table of waits the leader's
-- tick makes for polls (part of the library: _lib.lua; the range around it: _range.lua). Issue 18;
-- bench/estimate_sim.py measures it.
--!exports: estimate_told model_tick waits_read

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
-- Admissions come with the next tick: the beat sends the admission tick every second (queueing/schedules.py).
local TICK_S = 1

-- What the estimate takes of the queue that is the same for every place in line (the bucket, the free
-- slots, the pace at which slots come back and which ones come back first), worked out once for a poll's
-- or a join's one wait and once for all the places of the tick's table (waits_tabulate). nil: no estimate
-- (not open, no outflow). The slots' model is worked out when a wait first needs a slot that is not free.
local function estimate_inputs(p, st, now, used)
  if p.state ~= 'open' then return nil end
  local r_out = p.outflow / 60
  if r_out <= 0 then return nil end
  local e = {
    until_start = math.max(0, p.starts_at_ms - now) / 1000,
    r_out = r_out,
    tokens = math.max(0, whole_tokens((bucket_tokens(p, st, math.max(now, p.starts_at_ms))))),
    free = math.max(0, capacity_now(p, st, now) - (used or used_slots(p, st))),
    -- (before a shuffled start's draw those ahead will be any of the line, not the look's first places)
    drawn = not (p.shuffle_pending and now < p.starts_at_ms),
  }
  local service_ms = num(st, 'ema_service_ms', 0)
  if service_ms > 0 then
    service_ms = num(st, 'svm', service_ms)  -- the mean hold by the bands' rates, slots still held counted
    e.r_cap = p.capacity / (service_ms / 1000)
  elseif p.capacity_source == 'reported' and num(st, 'ema_ts', 0) > 0 then
    -- the site counts its own sessions, so their length is never seen here: the observed pace
    -- (not since a spell nobody was in the queue, the ticks leaving it alone: idle.lua)
    local age_s = st.idle and 0 or math.max(0, now - num(st, 'ema_ts', 0)) / 1000
    e.r_cap = num(st, 'ema_rate', 0) * math.exp(-age_s / RATE_TAU_S)
  end
  return e
end

-- The slots' model, once: the tick's curve of slots back, the slots held by visitors taken to have left
-- (returns_look: 'svo'; they come back at their deadlines, the first at gone_end; the rest of the site
-- turns over at its pace) and the late admissions looked at one by one (slots_back).
local function slots_model(p, st, now, e)
  if not e.slots then
    local r_cap = e.r_cap
    local m = {curve = numbers(st.svr, RETURN_POINTS + 2), r_live = r_cap, gone_n = 0, gone_end = 0}
    -- drawn for an empty house the ticks leave alone (idle.lua): it holds whenever it is read, as the curve
    -- a tick drew for it reads on average until the next (the slots a burst fills between two ticks)
    if m.curve and m.curve[1] == 0 then m.curve[1] = now - TICK_S * 500 end
    local svo = numbers(st.svo, 2)
    if svo and p.capacity > 0 then
      m.gone_n, m.gone_end = svo[1], math.max(0, svo[2] - now) / 1000
      m.r_live = r_cap * math.max(0, p.capacity - m.gone_n) / p.capacity
    end
    m.back = slots_back(p, now, m.r_live, m.curve) or false
    e.slots = m
  end
  return e.slots
end

local function estimate_wait(p, st, ahead, now, used, level, own_s, exact, e)
  e = e or estimate_inputs(p, st, now, used)
  if not e then return -1 end
  local until_start, r_out, tokens, free, r_cap = e.until_start, e.r_out, e.tokens, e.free, e.r_cap
  local present, look = present_read(st, now, ahead, e.drawn)
  local back, curve, r_live, gone_n, gone_end = nil, nil, r_cap, 0, 0
  if r_cap ~= nil and r_cap > 0 and 2 * (present + 1) > free then
    local m = slots_model(p, st, now, e)
    back, curve, r_live, gone_n, gone_end = m.back or nil, m.curve, m.r_live, m.gone_n, m.gone_end
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
      local back_s = returns(n - free)
      if back_s > t then t = back_s end  -- (math.max written out: every step of a bisection asks)
      if t == math.huge then return nil end
    end
    if not (t > 0) then return 0 end
    return t
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
    local cuts = cutting ~= 0 or cutting_slow ~= 0
    local function admissions(t)  -- n(t): those ahead still there when reached, cutters, and itself
      local ahead_n = present  -- (no cutters: priority_cutters is 0; math.min written out)
      if cuts then ahead_n = present + priority_cutters(cutting, cutting_slow, t) end
      local n = ahead_n * (stay and stay(t) or 1) + 1
      if n < cap then return n end
      return cap
    end
    -- f(t) = drained(n(t)) - t falls from >= 0 at 0 to <= 0 at hi: its root by false position, the end
    -- that stays put weighed half each time (Illinois), into a bracket as narrow as 14 halvings made it
    -- (the same answer, to hi / 32768 s: bisection took 14 turns a wait, this 6.4 and two ends on the full
    -- house bench/script_cost.py ticks on; a tick's table works out ~25 waits, issue 49). A step that would
    -- not fall inside the bracket halves it instead.
    local lo, hi = 0, drained(cap)
    local width, flo, fhi = hi / 16384, drained(admissions(0)), drained(admissions(hi)) - hi
    if flo <= 0 then hi = lo elseif fhi >= 0 then lo = hi end  -- the root at an end
    local moved = 0  -- the end the last step moved: 1 lo, -1 hi
    for step = 1, 40 do
      if hi - lo <= width then break end
      t = lo + flo * (hi - lo) / (flo - fhi)
      -- (past 8 steps, halving: a jump in f, where slots come back at their deadlines, slows false position)
      if step > 8 or not (t > lo and t < hi) then t = (lo + hi) / 2 end
      local ft = drained(admissions(t)) - t
      if ft > 0 then
        if moved == 1 then fhi = fhi / 2 end  -- hi stayed put twice
        lo, flo, moved = t, ft, 1
      else
        if moved == -1 then flo = flo / 2 end
        hi, fhi, moved = t, ft, -1
      end
    end
    t = (lo + hi) / 2
  end
  t = until_start + t + TICK_S / 2  -- admissions come with the next tick
  if exact then return t end  -- (the tick's table: rounded once, by the poll that reads it)
  return math.ceil(t)
end

-- The estimate a waiting visitor is told: before a scheduled start's draw its place is not known yet, so
-- the estimate is for the middle of the pre-queue as it will be at the start (the API gives the range over
-- the draw): it grows until then at the pace it has grown since it opened (over at least PREQUEUE_PACE_S,
-- so that its first seconds do not make a crowd of a handful). Seen in the simulator: counting only those
-- in it so far, the first to join were told the wait of the middle of seven, and had the wait of a place
-- among sixty.
local PREQUEUE_PACE_S = 10
function estimate_told(p, st, level, rank, now, used, joined, exact, e)
  local own_s = (now - (joined or now)) / 1000
  if p.shuffle_pending and now < p.starts_at_ms then
    local n = line_count()
    if p.prequeue_opens_ms > 0 and now > p.prequeue_opens_ms then
      local open_s = math.max(PREQUEUE_PACE_S, (now - p.prequeue_opens_ms) / 1000)
      n = n + n / open_s * (p.starts_at_ms - now) / 1000
    end
    return estimate_wait(p, st, (n - 1) / 2, now, used, level, own_s, exact, e)
  end
  return estimate_wait(p, st, rank, now, used, level, own_s, exact, e)
end

-- The waits at a few places in line, tabulated by the leader's tick once a second (waits_tabulate), so that
-- a poll reads its wait there (waits_read) instead of working it out (issue 49: the poll pays only for
-- what it reads; the model is the tick's). A place's wait is estimate_told's for the visitor who stands
-- there (its time waited so far). The places: 0, 1, 2, 4, 8, ... and the last, then the middle of each
-- stretch between two, kept, and the stretch split again wherever that middle is off the straight line
-- between its ends (a step: the slots of admissions nobody claimed come back at their deadlines, then the
-- sessions' pace), at most WAITS_MORE middles in all. A poll between two places takes the straight line
-- between them. The table is 'wt' in st: "the tick's now, then place and wait, place and wait, ...", each
-- wait rounded up to a tenth of a second, and to a whole second only by the poll, after the seconds since
-- the tick are taken off (rounded up at the tick, a wait read a moment later was told up to a second long;
-- rounded to the nearest tenth, a wait of 56.04 s was read as 56 where a poll worked out 57). A
-- poll uses it only while it is fresh (WAITS_FRESH_MS), for a visitor of level 0 within the places it
-- covers, on an open queue that is not waiting for a shuffled start's draw; any other poll works its wait
-- out as before. A join always does (the wait told at the join is the one the range learns from).
-- The table runs past the line's end by half its length (at least WAITS_PAST places): those places are
-- for visitors who join before the next table (waited nothing yet), whose polls read it too.
local WAITS_MORE, WAITS_PAST = 24, 16

-- The table carried (issue 49: the table is ~60 % of the model's Redis time, ~1.3 ms for a full house): the
-- last table, its places moved up by those taken out at the head since ('wto' as the look before this one
-- left it) and its waits aged by the seconds since, is what polls have read meanwhile, and what the model
-- would make again if it knows no more than it did. It is made again in full only when the waits worked out
-- now at a few places (the head, a quarter, half and all of the line, the last place of the carried table)
-- stray from it by more than the table's own straight-line test allows (a second, or 3 %), when it
-- no longer reaches WAITS_PAST places past the line's end, or when it was made in full WAITS_CARRY_MS ago.
local WAITS_CARRY_MS = 16000

-- Tables read, kept by their text (a poll of the same second finds it decoded; at most 256 kept): the
-- tick's now, then place and wait, place and wait, ... (one list: as 'wt' spells it).
local TABLES, TABLES_KEPT = {}, 0

local function waits_decoded(text)
  local v = TABLES[text]
  if not v and text then
    v = numbers(text, select(2, string.gsub(text, '%S+', '')))
    if TABLES_KEPT >= 256 then TABLES, TABLES_KEPT = {}, 0 end
    TABLES[text], TABLES_KEPT = v, TABLES_KEPT + 1
  end
  return v
end

-- The wait at `place` in a decoded table, on the straight line between the places either side; nil past
-- its last place, or between a known wait and an unknown one (< 0: an unknown wait is answered as such).
local function table_at(v, place)
  if place > v[#v - 1] then return nil end
  local i = 2
  while v[i] < place do i = i + 2 end  -- the first place at or past `place`
  local w = v[i + 1]
  if v[i] > place and i > 2 then
    local before = v[i - 1]
    if (before < 0) ~= (w < 0) then return nil end
    if w >= 0 then w = before + (w - before) * (place - v[i - 2]) / (v[i] - v[i - 2]) end
  end
  return w
end

-- The old table as it stands now (a decoded table; nil: none to carry): `moved` fewer places, `age_s` older.
local function waits_carried(text, moved, age_s)
  local v = waits_decoded(text)
  if not v or #v < 3 or string.find(text, ' %-') then return nil end
  local out = {v[1]}
  for i = 2, #v - 1, 2 do
    local place, wait = v[i] - moved, math.max(0.1, v[i + 1] - age_s)  -- (never unknown by age: '-')
    if place >= 0 then
      if #out == 1 and place > 0 and i > 2 then  -- the old place that is the head now, on the straight line
        local a, wa = v[i - 2] - moved, v[i - 1] - age_s
        out[2], out[3] = 0, math.max(0.1, wa + (wait - wa) * (0 - a) / (place - a))
      end
      local k = #out
      out[k + 1], out[k + 2] = place, wait
    end
  end
  if #out == 1 then return nil end
  return out
end

local function waits_write(now, v, up)
  local out = {string.format('%d', now)}
  for i = 2, #v - 1, 2 do
    local w = up and math.ceil(v[i + 1] * 10) or math.floor(v[i + 1] * 10 + 0.5)
    out[#out + 1] = string.format('%d %.1f', v[i], w / 10)
  end
  redis.call('HSET', K_ST, 'wt', table.concat(out, ' '))
end

-- old: the queue's counters as the tick found them (the table then, and 'wto' before this tick's look).
local function waits_tabulate(p, st, now, old)
  local n = line_count()
  if p.state ~= 'open' or n == 0 or (p.shuffle_pending and now < p.starts_at_ms) then
    if st.wt then redis.call('HDEL', K_ST, 'wt') end
    return
  end
  local used = used_slots(p, st)
  local e = estimate_inputs(p, st, now, used)  -- the same for every place
  local worked = {}
  local function wait_at(place)
    local w = worked[place]
    if w then return w end
    local tids = line_range(place, place)
    local rec = tids[1] and load(vk_of(tids[1]))
    w = estimate_told(p, st, 0, place, now, used, rec and rec[R_JOINED] or now, true, e)
    worked[place] = w
    return w
  end
  local last = n - 1 + math.max(WAITS_PAST, math.ceil(n / 2))
  local made = tonumber(old.wtm)
  local made_at = old.wt and tonumber(string.match(old.wt, '^(%d+)'))
  if made and made_at and now >= made_at and now - made < WAITS_CARRY_MS then
    local v = waits_carried(old.wt, math.max(0, tonumber(old.wto) or 0), (now - made_at) / 1000)
    if v and v[#v - 1] >= n - 1 + math.min(WAITS_PAST, math.ceil(n / 2)) then
      local holds = true
      for k, place in ipairs({0, math.floor(n / 4), math.floor(n / 2), n - 1, v[#v - 1]}) do
        local w, c = wait_at(place), table_at(v, place)
        -- (the head's wait moves by a slot's or a token's step, a second or two, and its visitor goes
        -- through in a moment: a looser test there; a third of the three-burst sale's checks failed on it)
        if w < 0 or not c or math.abs(w - c) > (k == 1 and 2 or math.max(1, 0.03 * w)) then
          holds = false
          break
        end
      end
      if holds then
        waits_write(now, v, false)
        return
      end
    end
  end
  local places, waits, place = {}, {}, 0
  while true do
    places[#places + 1], waits[#waits + 1] = place, wait_at(place)
    if place >= last then break end
    place = math.min(last, math.max(1, place * 2))
  end
  local i, more = 1, WAITS_MORE
  while i < #places and more > 0 do
    local a, b, wa, wb = places[i], places[i + 1], waits[i], waits[i + 1]
    if b - a > 1 then
      local m = math.floor((a + b) / 2)
      local wm = wait_at(m)
      more = more - 1
      table.insert(places, i + 1, m)
      table.insert(waits, i + 1, wm)
      local straight = wa + (wb - wa) * (m - a) / (b - a)
      local off = (wa < 0) ~= (wb < 0) or (wm < 0) ~= (wa < 0) or math.abs(wm - straight) > math.max(1, 0.03 * wm)
      if not off then i = i + 2 end  -- (else the first half is looked at next, then the second)
    else
      i = i + 1
    end
  end
  local v = {now}
  for k = 1, #places do v[2 * k], v[2 * k + 1] = places[k], waits[k] end
  waits_write(now, v, true)
  redis.call('HSET', K_ST, 'wtm', now)
end

-- The model is made by the leader's tick every `every` ms while people wait in line (WR_MODEL_SECONDS: 4 by
-- default; issue 49: it is ~95 % of the tick's Redis time, ~2 ms for a full house, and at 4 s the tick costs
-- about a quarter; bench/RESULTS.md has what that does to the estimates): the look at the line (silent_look), the
-- look at the slots held (returns_look) and the table of waits. Between two, polls read the table made
-- last (the visitor at a place now stood further back then: 'wto'; it has waited the seconds since), and
-- the looks' sums hold, as they do between two ticks. Made every second while nobody is in line (no table
-- to make, the look at the slots held is all). Made at the next tick instead when the table cannot
-- answer the line as it is: none while polls need one (opened, a line formed, the policy changed since:
-- config.lua drops it, a new capacity or outflow changes every wait), a wait in it unknown (no slot given
-- back yet: a poll works it out), the line grown past its last place, or by an eighth since the look (a
-- burst: a join works its own wait out on the model's inputs as the last tick left them).
local WAITS_FRESH_MS = 5500  -- (a model every 4 s, and a tick a little late: polls stay on the table)

local function model_due(p, st, now, waiting, made, every, looked)
  -- (nobody in line: a look at the slots held, cheap; a curve drawn 3 s before a burst took the free slots
  -- had those holds begin then: told 2-3 s short. Half a tick early: the beat's ticks are a second apart
  -- give or take, and one 0.98 s after the last was not due: a quarter of "every tick" made no model)
  if waiting == 0 or not made or now < made or now - made > every - TICK_S * 500 then return true end
  if p.state ~= 'open' or (p.shuffle_pending and now < p.starts_at_ms) then return false end
  -- (a line grown by over an eighth since the last `looked` at it: a burst's seconds each make one)
  if looked and waiting + (tonumber(st.wto) or 0) - looked > looked / 8 + 2 then return true end
  local text = st.wt
  if not text or string.find(text, ' %-') then return true end  -- none, or an unknown wait ('-1.0')
  local last = tonumber(string.match(text, '(%d+) %S+$'))
  return not last or waiting - 1 + (tonumber(st.wto) or 0) > last
end

-- The leader's tick: the model made when it is due (the head's sums h saved with the line's then); true
-- when it was made, false when the tick left it as it was (the caller saves h if it learnt).
function model_tick(p, st, now, h, waiting, every)
  local made, looked = string.match(st.lj or '', '^%[([^,%]]+),(%d+)')  -- the last look's time, line
  made, looked = tonumber(made), tonumber(looked)
  if not model_due(p, st, now, waiting, made, every, looked) then return false end
  local dt = (made and now > made) and math.max(1, (now - made) / 1000) or 1
  silent_look(p, st, now, h, dt, math.max(1, every / 1000))
  returns_look(p, st, now)
  -- the waits polls read, from what the looks saw (st as a poll reads it)
  if waiting > 0 then waits_tabulate(p, figure_stats(), now, st) elseif st.wt then redis.call('HDEL', K_ST, 'wt') end
  return true
end

-- The wait of a visitor of level 0 at `rank`, from the tick's table; nil when the table does not answer
-- (the poll works it out). Admissions since the table was made ('wto': everyone they took out of the line,
-- from its head, admit.lua) moved every place up by as many: the visitor at `rank` now was at rank + wto
-- then, and has waited the seconds since (the table stays: it was dropped at each admission between two
-- ticks, and the polls until the next one worked their waits out, ~6 times the Redis time).
function waits_read(p, st, rank, now)
  local text = st.wt
  if not text or p.state ~= 'open' or (p.shuffle_pending and now < p.starts_at_ms) then return nil end
  local v = waits_decoded(text)
  local age = now - v[1]
  if age < 0 or age > WAITS_FRESH_MS then return nil end
  local w = table_at(v, rank + (tonumber(st.wto) or 0))
  if not w then return nil end
  if w < 0 then return -1 end  -- unknown (estimate_wait: no slot given back yet, a paused start)
  return math.max(1, math.ceil(w - age / 1000))
end
