-- complete.lua: ADMITTED or ACTIVE -> COMPLETED; frees the slot at once.
--
-- KEYS: the standard queue keys (see _lib.lua), then KEYS[12]: the session's binding (session_start.lua),
-- deleted with the session it binds (issue 50: it outlived a completed session, until the token's expiry).
-- ARGV[1] visitor key    ARGV[2] sequence number    ARGV[3] fencing token    ARGV[4] now (ms)
-- ARGV[5] the access token's epoch
--
-- Returns {result, freed, moves}: result 'completed' (now), 'already' (completed before: completing twice
-- is harmless), or 'expired' | 'superseded' | 'revoked' | 'no_config'. freed = 1 when a slot came free;
-- moves as in _lib.lua (a ticket taken out of the line, below).
--
-- A session of an earlier epoch whose record went with lost state (SPEC 3.6) is completed as it is: it
-- holds no slot any more, and it is noted as completed, so that the token cannot start it again.
-- A ticket whose admission the lost state took (a failover's lost writes) is its own visit still: back
-- at the head of the line, or admitted again under a newer fence. The site's completion with the first
-- token ends it either way ('superseded' is a newer ticket's, or a token newer than the record).

local vk, seq, fence, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local p = policy()
if not p then return {'no_config', 0, 0} end

local function completed(freed, moves)  -- the session ends: so does its binding to a browser
  if KEYS[12] then redis.call('DEL', KEYS[12]) end
  return {'completed', freed, moves}
end

if restorable(p, vk, seq, tonumber(ARGV[5]) or p.epoch, now) then
  save(vk, {seq, COMPLETED, 0, now, math.floor(now / 1000), '', -1, fence, now, now, now, now, 'completed'})
  redis.call('ZADD', K_DONE, now, vk)
  redis.call('HINCRBY', K_ST, 'completed', 1)
  return completed(0, 0)
end

local rec = load(vk)
if rec and rec[R_SEQ] == seq and rec[R_STATUS] == WAITING then  -- its admission lost: back in the line
  finish(ticket_id(seq, vk), rec, COMPLETED, 'completed', now)
  return completed(0, moves_reply())
end
if rec and rec[R_SEQ] == seq and (rec[R_FENCE] or 0) > fence then fence = rec[R_FENCE] end  -- admitted again

local reason, freed
rec, reason, freed = session_lookup(p, vk, seq, fence, now, rec)
if reason == 'completed' then return {'already', 0, 0} end
if reason then return {reason, freed, 0} end

finish(ticket_id(seq, vk), rec, COMPLETED, 'completed', now)
return completed(1, 0)
