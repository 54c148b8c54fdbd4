-- leave.lua: the visitor gives up its ticket; WAITING, ADMITTED or ACTIVE -> EXPIRED (reason 'left').
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key    ARGV[2] sequence number (from the signed ticket)    ARGV[3] now (ms)
--
-- Returns {result, freed, moves}: result 'left' | 'gone' (unknown or already finished: leaving twice
-- is harmless); freed = 1 when it held a slot; moves as in _lib.lua.

local vk, seq, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local rec = load(vk)
if not rec or rec[R_SEQ] ~= seq or rec[R_STATUS] > ACTIVE then return {'gone', 0, {0, {}}} end

if rec[R_STATUS] == WAITING then  -- a walk-away, after its wait so far (estimate_wait's hazard)
  hazard_save(hazard_note(hazard_stored(), 1, waited_s(rec, now, false)))
end
local held = finish(ticket_id(seq, vk), rec, EXPIRED, 'left', now)
if held then return {'left', 1, moves_reply()} end
return {'left', 0, moves_reply()}
