-- status.lua: a ticket's state, which is also its heartbeat (a poll proves the visitor is present).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key      ARGV[2] sequence number (from the signed ticket), or 0 for whatever ticket
--         the visitor has (the no-JavaScript page knows the visitor, not the ticket)     ARGV[3] now (ms)
-- From the signed ticket, to give its place back after lost state (SPEC 3.6): ARGV[4] its epoch
-- ARGV[5] priority level   ARGV[6] line score at join ('' unknown: its sequence number)   ARGV[7] joined (ms)
-- The poll's rate limiter, when it is a token bucket (ratelimit.TokenBucket; any other algorithm runs as a
-- script of its own in the same call): ARGV[8] capacity, ARGV[9] refill per second, ARGV[10] cost,
-- ARGV[11] the limiter's now (ms); absent when polls are not limited that way. Its state is one number in
-- the ticket's record (bucket_take in _transitions.lua).
--
-- Returns {outcome, ticket, figures (poll_figures), moves[, limit]}:
--   'ok'        ticket = {tid, seq, status, rank or -1, fence, expires_ms, est_wait_s, reason, 0, priority}
--   'limited'   the limiter refused the poll (ticket and figures empty); it still counted as presence
--   'gone'      the ticket is not known (long finished, or replaced by a newer one); figures empty
--   'no_config' the queue's policy is not in Redis
-- limit, only when the token bucket refused the poll: {0, retry after (ms), tokens left, 0} as the
-- lua/limits/ scripts reply. Only a live ticket's polls are counted (their record is written anyway, for
-- presence): a poll of an unknown, finished or overdue ticket writes nothing and is always answered.
-- moves (see _lib.lua): a parked visitor seen again returns to its place, moving those behind it; so
-- does a ticket of an earlier epoch whose record was lost with the state: it is put back in line at its
-- own place (the shuffle's place for a pre-queue ticket, else its score at join), ahead of everyone
-- who joined in this epoch.
-- est_wait_s is -1 when unknown; reason is set for finished tickets. A ticket found past its deadline
-- (abandoned, unclaimed, session over) is reported expired at once; the transition itself (which
-- frees its slot) is left to the admission tick and cleanup, so a poll never writes more than presence.

local vk, seq, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local bucket = tonumber(ARGV[8])

local p = policy()
if not p then return {'no_config', {}, {}, {0, {}}} end
if p.mode == 'stateless' then return {'gone', {}, {}, {0, {}}} end  -- a ticket from before the switch

local rec = load(vk)
if not rec and seq > 0 and restorable(p, vk, seq, tonumber(ARGV[4]) or p.epoch, now) then
  local pri = tonumber(ARGV[5]) or 0
  local score = tonumber(redis.call('HGET', K_RESTORE, seq)) or tonumber(ARGV[6]) or seq
  rec = {seq, WAITING, pri, tonumber(ARGV[7]) or now, math.floor(now / 1000), '', -1}
  line_score_keep(rec, score)
  save(vk, rec)
  local tid = ticket_id(seq, vk)
  line_add(tid, score)
  redis.call('HINCRBY', K_ST, 'restored', 1)
  moved('+', line_rank(tid, score))
end
if not rec or (seq ~= 0 and rec[R_SEQ] ~= seq) then return {'gone', {}, {}, moves_reply()} end
local tid = ticket_id(rec[R_SEQ], vk)

local reason = nil
if rec[R_STATUS] <= ACTIVE then reason = overdue(p, rec, now) end
if reason then
  -- Report it as over; the admission tick or cleanup performs the transition (and frees the slot).
  rec[R_STATUS] = EXPIRED
  rec[R_REASON] = reason
elseif rec[R_STATUS] <= ACTIVE then
  local second = math.floor(now / 1000)
  if rec[R_SEEN] < second then rec[R_SEEN] = second end  -- (never back: a notice's promise is later, notice.lua)
  local refused = bucket and bucket_take(rec, tonumber(ARGV[11]), bucket, tonumber(ARGV[9]) / 1000, tonumber(ARGV[10]))
  save(vk, rec)
  if refused then return {'limited', {}, {}, moves_reply(), refused} end
end

local st = poll_stats()  -- what the figures and the table of waits need; the models' inputs only if worked out
local used = used_slots(p, st)  -- counted once: the estimate and the figures both need it
local rank, est = -1, 0
if rec[R_STATUS] == WAITING then
  rank = waiting_rank(tid, rec)
  if not rank then return {'gone', {}, {}, moves_reply()} end
  -- the tick's table of waits (waits_read), else worked out here (-1 at once when admission is stopped)
  est = rec[R_PRI] == 0 and waits_read(p, st, rank, now)
  if not est then
    if p.state == 'open' then poll_stats(st) end  -- the model's inputs too
    est = estimate_told(p, st, rec[R_PRI], rank, now, used, rec[R_JOINED])
  end
end
return {'ok', ticket_reply(tid, rec, rank, est, 0), poll_figures(p, st, used), moves_reply()}
