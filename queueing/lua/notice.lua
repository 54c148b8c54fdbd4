-- notice.lua: a waiting visitor asked to be told by e-mail when their turn is near and when it comes
-- (services/notices.py). Their ticket joins the queue's `noticed` set (score 0 until its nearness is told,
-- then 1: notices.lua) and is seen until the notice's end: the notice promises their presence while they
-- are away from the page, so admission does not park them and cleanup does not abandon them, as the polls
-- of a page kept open would; no sighting ever moves a record's back (status.lua, roll_call.lua). When the
-- ticket leaves the line it goes to `notice_due` (_transitions.lua, noticed_leaves).
--
-- KEYS: the standard queue keys (see _lib.lua), then KEYS[12] noticed (ZSET), KEYS[13] notice_due (LIST).
-- ARGV[1] ticket id    ARGV[2] seen until (s): the notice's end    ARGV[3] now (ms)    ARGV[4] 1: its
-- nearness was told already (a notice kept again after lost state), else 0
--
-- Returns 'ok'; 'gone' when the ticket is not waiting (unknown, of another ticket, admitted, over or
-- overdue); 'no_config' when the queue's policy is not in Redis.

local tid, until_s, now, told = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local p = policy()
if not p then return 'no_config' end
local vk = vk_of(tid)
local rec = load(vk)
if not rec or ticket_id(rec[R_SEQ], vk) ~= tid or rec[R_STATUS] ~= WAITING or overdue(p, rec, now) then
  return 'gone'
end
if rec[R_SEEN] < until_s then
  rec[R_SEEN] = until_s
  save(vk, rec)
end
redis.call('ZADD', KEYS[12], told, tid)
return 'ok'
