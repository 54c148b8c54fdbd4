-- _transitions.lua: the moves every transition shares: admit, finish, park, a ticket's reply, lapsed
-- claims and sessions (part of the library: _lib.lua).
--!exports: moves_reply admit finish park waiting_rank bucket_take overdue finish_overdue ticket_reply
--!exports: restorable session_lookup expire_slots

local WAITS_KEEP = 20000  -- samples not yet drained (the task runs every 10 s): the newest are kept

-- {event sequence, moves}, or 0 when nobody moved: the sequence grows by one for every call that moved anyone, so a client
-- that sees a gap knows it missed an event and polls.
function moves_reply()
  if #MOVES == 0 then return 0 end  -- store.Moves reads 0 as nobody moved
  return {redis.call('HINCRBY', K_ST, 'evseq', 1), MOVES}
end

-- Turn notices (services/notices.py, notice.lua): a noticed ticket is seen until its notice's end, far past
-- any poll's now, so only such a ticket asks the `noticed` set (of services/notices.py's run) whether it is
-- there; when it leaves the line (admitted, or finished while waiting) it goes to `notice_due`, for the run to
-- tell or forget. Every other ticket pays one comparison. (Clocks of app servers may differ by a little:
-- a sighting at most NOTICE_AHEAD_S ahead of now is a poll's.)
local NOTICE_AHEAD_S = 5
local function noticed_leaves(tid, rec, now)
  if rec[R_SEEN] <= now / 1000 + NOTICE_AHEAD_S then return end
  local base = string.sub(K_CFG, 1, -4)  -- store.QueueKeys: every key is its base and its name
  if redis.call('ZREM', base .. 'noticed', tid) == 1 then redis.call('RPUSH', base .. 'notice_due', tid) end
end

-- WAITING -> ADMITTED. The caller has removed the ticket from the line and checked the policy.
function admit(p, tid, rec, now)
  local vk = vk_of(tid)
  noticed_leaves(tid, rec, now)
  local fence = redis.call('HINCRBY', K_ST, 'fence', 1)
  local deadline = now + p.claim_ttl * 1000
  local expires = now + p.session_ttl * 1000
  rec[R_STATUS] = ADMITTED
  rec[R_FENCE] = fence
  rec[R_ADMITTED] = now
  rec[R_DEADLINE] = deadline
  rec[R_EXPIRES] = expires
  rec[R_ENDED] = 0
  rec[R_REASON] = ''
  line_score_keep(rec, rec[R_SEQ])  -- out of line: no place to keep
  save(vk, rec)
  redis.call('ZADD', K_CLAIMS, deadline, tid)
  redis.call('HINCRBY', K_ST, 'admitted', 1)
  ema_update('ema_wait_ms', math.max(0, now - rec[R_JOINED]))
  local sample = tid .. ' ' .. fmt(rec[R_JOINED]) .. ' ' .. fmt(now) .. ' ' .. fmt(rec[R_EST] or -1)
  if wait_learn(rec, now) then sample = sample .. ' stopped' end  -- admission stopped while it waited
  redis.call('RPUSH', K_WAITS, sample)
  redis.call('LTRIM', K_WAITS, -WAITS_KEEP, -1)
  return {tid, fence, expires, rec[R_JOINED], rec[R_EST]}
end

-- How long a slot is held (ema_service_ms: sessions and unclaimed admissions alike), the mean of the
-- last ~SERVICE_SPAN slots given back (the mean of all of them until there are that many). Slots come
-- back shortest first after a burst, then the long ones: an average weighing the last ten (as it was)
-- followed that order, low and then high (tests/test_estimates.py: 16.2 s for sessions of 14.5 s).
-- The slot of rec, given back at now: its hold as the line's (a join's claim wait is shorter: claim_shift).
local function service_note(rec, now)  -- SERVICE_SPAN: _estimates.lua; and the holds' bands (hold_note)
  local b = redis.call('HMGET', K_ST, 'ema_service_ms', 'svc_n', 'cwl', 'cwj')  -- (hold_note writes none)
  local sample = math.max(0, now - rec[R_ADMITTED])
  if rec[R_ADMITTED] == rec[R_JOINED] then sample = sample + 1000 * claim_shift(b[3] or nil, b[4] or nil) end
  hold_note(sample, now)
  local n = (tonumber(b[2]) or (b[1] and 10 or 0)) + 1  -- a queue from before the count: as if ten
  local old = tonumber(b[1]) or sample
  local new = old + (sample - old) / math.min(n, SERVICE_SPAN)
  redis.call('HSET', K_ST, 'ema_service_ms', fmt(new), 'svc_n', math.min(n, SERVICE_SPAN))
end

-- Any live ticket -> a final state. Frees its slot if it held one; keeps the record for a while
-- (the `done` set) so a late poll hears `completed` or `expired` rather than nothing.
function finish(tid, rec, status, reason, now)
  local vk = vk_of(tid)
  local held = rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE
  if rec[R_STATUS] == WAITING then
    line_remove(tid, line_score_of(rec))
    redis.call('ZREM', K_AWAY, tid)
    noticed_leaves(tid, rec, now)
  elseif held then
    redis.call('ZREM', K_CLAIMS, tid)
    redis.call('ZREM', K_SESSIONS, tid)
    service_note(rec, now)
  end
  while #rec < R_REASON do rec[#rec + 1] = 0 end
  for i = #rec, R_LINE_SCORE, -1 do rec[i] = nil end  -- the parked place, the status limiter's bucket
  rec[R_STATUS] = status
  rec[R_ENDED] = now
  rec[R_REASON] = reason
  save(vk, rec)
  redis.call('ZADD', K_DONE, now, vk)
  redis.call('HINCRBY', K_ST, reason, 1)
  return held
end

-- A waiting visitor found absent at the head leaves the line for `away`, so admission does not look at
-- it again; its line score goes into the record. Same memory: one entry moves from one set to another.
function park(tid, rec)
  local score = line_score_of(rec)
  while #rec < R_REASON do rec[#rec + 1] = 0 end
  rec[R_LINE_SCORE] = score
  save(vk_of(tid), rec)
  line_remove(tid, score)
  redis.call('ZADD', K_AWAY, rec[R_SEEN], tid)
end

-- The rank of a waiting ticket; a parked one that shows up again first gets its place back.
function waiting_rank(tid, rec)
  local score = line_score_of(rec)
  local rank = line_rank(tid, score)
  if rank or not redis.call('ZSCORE', K_AWAY, tid) then return rank end
  redis.call('ZREM', K_AWAY, tid)
  line_add(tid, score)
  for i = #rec, R_EST + 1, -1 do rec[i] = nil end  -- back to the small waiting record
  line_score_keep(rec, score)
  save(vk_of(tid), rec)
  rank = line_rank(tid, score)
  moved('+', rank)
  return rank
end

-- The status limiter's token bucket (lua/limits/token_bucket.lua's rule, status.lua) kept in the ticket's
-- record as one number: R_BUCKET, the time (ms after the visitor joined) at which the bucket was empty; at
-- `at` it holds (at - that time) x rate tokens, at most its capacity. A request takes `cost` tokens or is
-- refused, and a refusal changes nothing. Returns nil when it was let through, else a limiter's refusal:
-- {0, retry after (ms), tokens left, 0}.
local R_BUCKET = 15
function bucket_take(rec, at, capacity, per_ms, cost)
  local tokens = capacity
  if rec[R_BUCKET] then tokens = math.min(capacity, (at - rec[R_JOINED] - rec[R_BUCKET]) * per_ms) end
  -- The epsilon absorbs float drift: 0.01 a second is 1.0000000000000001e-05 a ms.
  if tokens + 1e-9 < cost then return {0, math.ceil((cost - tokens) / per_ms), fmt(tokens), 0} end
  tokens = math.max(0, tokens - cost)
  while #rec < R_BUCKET - 1 do rec[#rec + 1] = false end  -- no holes: msgpack keeps it an array
  rec[R_BUCKET] = at - rec[R_JOINED] - tokens / per_ms  -- whole ms mostly (8 bytes at most when not)
  return nil
end

-- Why a live ticket should already be over at `now` (absent too long, unclaimed, session ended), or nil.
function overdue(p, rec, now)
  local status = rec[R_STATUS]
  if status == WAITING and now - rec[R_SEEN] * 1000 > p.abandon_timeout * 1000 then
    return 'abandoned'
  elseif status == ADMITTED and now >= rec[R_DEADLINE] then
    return 'expired_claim'
  elseif status == ACTIVE and now >= rec[R_EXPIRES] then
    return 'expired_session'
  end
  return nil
end

-- Finish an overdue ticket; returns 1 when that freed a slot (the caller then runs admission).
function finish_overdue(tid, rec, reason, now)
  if finish(tid, rec, EXPIRED, reason, now) then return 1 end
  return 0
end

-- The ticket part of a join or status reply.
function ticket_reply(tid, rec, rank, est, freed)
  return {tid, rec[R_SEQ], rec[R_STATUS], rank, rec[R_FENCE] or 0, rec[R_EXPIRES] or 0, est,
          rec[R_REASON] or '', freed, rec[R_PRI]}
end

-- A signed ticket or access token of an earlier epoch whose record the lost state took with it, shown
-- while the window after the loss lasts (SPEC 3.6): its holder gets its place or session back.
-- Not one the database noted as finished before the loss (finished.lua; epoch.lua marks them 'gone').
function restorable(p, vk, seq, ticket_epoch, now)
  return ticket_epoch < p.epoch and now < p.restore_until_ms and not has_record(vk)
    and redis.call('HGET', K_RESTORE, seq) ~= 'gone'
end

-- Find the session an access token speaks of. Returns rec, reason: reason is nil when the session
-- is live; else 'expired' | 'superseded' | 'revoked' | 'completed'. A session found overdue is
-- finished here; the third value is then 1 when that freed a slot.
function session_lookup(p, vk, seq, fence, now, known)
  local rec = known or load(vk)  -- `known`: the record as the caller loaded it already (nil: not loaded)
  if not rec then return nil, 'expired', 0 end
  local live = rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE
  if rec[R_SEQ] ~= seq or rec[R_FENCE] ~= fence then
    -- The visitor's current ticket is another one: superseded if that one holds a session.
    if live and rec[R_SEQ] ~= seq then return rec, 'superseded', 0 end
    if rec[R_SEQ] == seq then return rec, 'superseded', 0 end
    return rec, 'expired', 0
  end
  if rec[R_STATUS] == REVOKED then return rec, 'revoked', 0 end
  if rec[R_STATUS] == COMPLETED then return rec, 'completed', 0 end
  if not live then return rec, 'expired', 0 end
  local reason = overdue(p, rec, now)
  if reason then return rec, 'expired', finish_overdue(ticket_id(seq, vk), rec, reason, now) end
  return rec, nil, 0
end

-- Expire admitted tickets past their claim deadline and sessions past their end, at most `limit`.
function expire_slots(now, limit)
  local expired = {}
  for _, spec in ipairs({{K_CLAIMS, 'expired_claim'}, {K_SESSIONS, 'expired_session'}}) do
    local due = redis.call('ZRANGEBYSCORE', spec[1], '-inf', now, 'LIMIT', 0, limit)
    for _, tid in ipairs(due) do
      local rec = load(vk_of(tid))
      if rec and (rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE) and ticket_id(rec[R_SEQ], vk_of(tid)) == tid then
        finish(tid, rec, EXPIRED, spec[2], now)
        if spec[1] == K_CLAIMS then  -- it walked away after it was last seen in the line, or at its admission
          local waited = (math.min(rec[R_SEEN] * 1000, rec[R_ADMITTED] or now) - rec[R_JOINED]) / 1000
          LAPSED[#LAPSED + 1] = waited
        end
      else
        redis.call('ZREM', spec[1], tid)  -- a stray entry: its record moved on
      end
      expired[#expired + 1] = tid
    end
  end
  return expired
end
