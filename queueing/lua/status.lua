-- status.lua: a ticket's state, which is also its heartbeat (a poll proves the visitor is present).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key      ARGV[2] sequence number (from the signed ticket), or 0 for whatever ticket
--         the visitor has (the no-JavaScript page knows the visitor, not the ticket)     ARGV[3] now (ms)
--
-- Returns {outcome, ticket, figures, moves}:
--   'ok'        ticket = {tid, seq, status, rank or -1, fence, expires_ms, est_wait_s, reason, 0, priority}
--   'gone'      the ticket is not known (long finished, replaced by a newer one, or Redis lost it)
--   'no_config' the queue's policy is not in Redis
-- moves (see _lib.lua): a parked visitor seen again returns to its place, moving those behind it.
-- est_wait_s is -1 when unknown; reason is set for finished tickets. A ticket found past its deadline
-- (abandoned, unclaimed, session over) is reported expired at once; the transition itself (which
-- frees its slot) is left to the admission tick and cleanup, so a poll never writes more than presence.

local vk, seq, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

local p = policy()
if not p then return {'no_config', {}, {}, {0, {}}} end
local st = hash_table(K_ST)

local rec = load(vk)
if not rec or (seq ~= 0 and rec[R_SEQ] ~= seq) then return {'gone', {}, figures(p, st), {0, {}}} end
local tid = ticket_id(rec[R_SEQ], vk)

local reason = nil
if rec[R_STATUS] <= ACTIVE then reason = overdue(p, rec, now) end
if reason then
  -- Report it as over; the admission tick or cleanup performs the transition (and frees the slot).
  rec[R_STATUS] = EXPIRED
  rec[R_REASON] = reason
elseif rec[R_STATUS] <= ACTIVE then
  rec[R_SEEN] = math.floor(now / 1000)
  save(vk, rec)
end

local rank, est = -1, 0
if rec[R_STATUS] == WAITING then
  rank = waiting_rank(tid, rec)
  if not rank then return {'gone', {}, figures(p, st), moves_reply()} end
  est = estimate_wait(p, st, rank, now)
end
return {'ok', ticket_reply(tid, rec, rank, est, 0), figures(p, st), moves_reply()}
