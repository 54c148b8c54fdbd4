-- session_start.lua: the protected site verifies an access token; ADMITTED -> ACTIVE on first use.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key    ARGV[2] sequence number    ARGV[3] fencing token    ARGV[4] now (ms)
-- ARGV[5] the access token's epoch    ARGV[6] its expiry (ms)
-- (all from the access token, whose signature and expiry Python has already checked)
--
-- Returns {result, expires_ms, freed}: result 'valid' | 'expired' | 'superseded' | 'revoked' | 'full' |
-- 'no_config'. A completed session no longer admits: it reads as 'expired'. freed = 1 when an overdue
-- session found here released a slot.
--
-- After lost state (SPEC 3.6), a token of an earlier epoch whose record went with the state starts its
-- session again, until the token's own expiry: a visitor already at the site is not thrown out. While
-- the new epoch holds its slot (epoch.lua, `capacity_now`) it comes back at once; afterwards only into a
-- free slot ('full' otherwise): the slots in use never exceed capacity.

local vk, seq, fence, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local p = policy()
if not p then return {'no_config', 0, 0} end

local expires = tonumber(ARGV[6]) or 0
if expires > now and restorable(p, vk, tonumber(ARGV[5]) or p.epoch, now) then
  if now >= p.restore_hold_ms and used_slots(p, hash_table(K_ST)) >= p.capacity then return {'full', 0, 0} end
  local tid = ticket_id(seq, vk)
  save(vk, {seq, ACTIVE, 0, now, math.floor(now / 1000), '', -1, fence, now, now, expires, 0, ''})
  redis.call('ZADD', K_SESSIONS, expires, tid)
  redis.call('HINCRBY', K_ST, 'restored_sessions', 1)
  return {'valid', expires, 0}
end

local rec, reason, freed = session_lookup(p, vk, seq, fence, now)
if reason == 'completed' then reason = 'expired' end
if reason then return {reason, 0, freed} end

if rec[R_STATUS] == ADMITTED then
  local tid = ticket_id(seq, vk)
  redis.call('ZREM', K_CLAIMS, tid)
  redis.call('ZADD', K_SESSIONS, rec[R_EXPIRES], tid)
  rec[R_STATUS] = ACTIVE
  save(vk, rec)
  redis.call('HINCRBY', K_ST, 'activated', 1)
end
return {'valid', rec[R_EXPIRES], 0}
