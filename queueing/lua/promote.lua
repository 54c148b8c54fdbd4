-- promote.lua: a waiting visitor's priority code raises its level (issue 20: codes on the waiting page).
-- The ticket stays WAITING and moves up to where a joiner of the new level would be placed now (join.lua's
-- rule, _policy.lua priority_place), never further back: one already ahead of that place keeps it.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key    ARGV[2] sequence number (from the signed ticket)    ARGV[3] now (ms)
-- ARGV[4] the code's level (1-3)
--
-- Returns {outcome, ticket, moves, rank before}: outcome
--   'promoted'     its level is now ARGV[4]; ticket as join.lua's (with its line score), rank before: its
--                  place before the code (the same when it kept its place)
--   'kept'         its level was ARGV[4] or higher already: nothing changed (the caller gives the use back)
--   'not_waiting'  admitted, in a session, or finished: a code moves only those in line; ticket as
--                  status.lua's (the caller gives the use back)
--   'gone'         unknown, another ticket of the visitor's, or overdue (then finished here: ticket = {}
--                  and rank before = 1 when that freed a slot)
--   'no_config'    the queue's policy is not in Redis: sync it and retry
-- moves: see _transitions.lua moves_reply() (the visitor left its place and was placed ahead of others).
-- The estimate told at join is dropped (R_EST = -1): it was for the old level, no lesson (wait_learn).

local vk, seq, now, level = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])

local p = policy()
if not p then return {'no_config', {}, 0, -1} end
if p.mode == 'stateless' then return {'no_config', {}, 0, -1} end
local rec = load(vk)
if not rec or rec[R_SEQ] ~= seq then return {'gone', {}, 0, -1} end
local tid = ticket_id(seq, vk)
local reason = overdue(p, rec, now)
if reason then return {'gone', {}, moves_reply(), finish_overdue(tid, rec, reason, now)} end
if rec[R_STATUS] ~= WAITING then return {'not_waiting', ticket_reply(tid, rec, -1, -1, 0), 0, -1} end

rec[R_SEEN] = math.max(rec[R_SEEN], math.floor(now / 1000))  -- (a notice's: notice.lua)
local st = hash_table(K_ST)
local before = waiting_rank(tid, rec)  -- a parked visitor gets its place back first
if before == nil then return {'gone', {}, moves_reply(), -1} end
if rec[R_PRI] >= level then
  save(vk, rec)
  local reply = ticket_reply(tid, rec, before, rec[R_EST], 0)
  reply[11] = fmt(line_score_of(rec))
  return {'kept', reply, moves_reply(), before}
end

local was = line_score_of(rec)
local score = priority_place(p, st, level, line_count(), seq)
local rank = before
if score < was then
  line_drop(tid, was)
  moved('-', before)
  line_add(tid, score)
  line_score_keep(rec, score)
  rank = line_rank(tid, score)
  moved('+', rank)
  priority_note(st, level, now)  -- placed ahead of others (estimate_wait)
else
  score = was
end
local tail = tonumber(st['t' .. level])
if tail == nil or score > tail then redis.call('HSET', K_ST, 't' .. level, fmt(score)) end
rec[R_PRI] = level
rec[R_EST] = -1
save(vk, rec)
local reply = ticket_reply(tid, rec, rank, -1, 0)
reply[11] = fmt(score)
return {'promoted', reply, moves_reply(), before}
