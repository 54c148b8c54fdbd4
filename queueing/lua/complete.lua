-- complete.lua: ADMITTED or ACTIVE -> COMPLETED; frees the slot at once.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key    ARGV[2] sequence number    ARGV[3] fencing token    ARGV[4] now (ms)
--
-- Returns {result, freed}: result 'completed' (now), 'already' (completed before: completing twice is
-- harmless), or 'expired' | 'superseded' | 'revoked' | 'no_config'. freed = 1 when a slot came free.

local vk, seq, fence, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local p = policy()
if not p then return {'no_config', 0} end

local rec, reason, freed = session_lookup(p, vk, seq, fence, now)
if reason == 'completed' then return {'already', 0} end
if reason then return {reason, freed} end

finish(ticket_id(seq, vk), rec, COMPLETED, 'completed', now)
return {'completed', 1}
