-- revoke.lua: any live ticket -> REVOKED (the protected site or staff throws a visitor out).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] ticket id    ARGV[2] now (ms)
--
-- Returns {result, freed, moves}: result 'revoked' | 'already' (it had finished) | 'not_found';
-- freed = 1 when it held a slot; moves as in _lib.lua.

local tid, now = ARGV[1], tonumber(ARGV[2])
local vk = vk_of(tid)
local rec = load(vk)
if not rec or ticket_id(rec[R_SEQ], vk) ~= tid then return {'not_found', 0, {0, {}}} end
if rec[R_STATUS] > ACTIVE then return {'already', 0, {0, {}}} end

local held = finish(tid, rec, REVOKED, 'revoked', now)
if held then return {'revoked', 1, moves_reply()} end
return {'revoked', 0, moves_reply()}
