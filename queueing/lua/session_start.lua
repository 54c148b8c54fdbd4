-- session_start.lua: the protected site verifies an access token; ADMITTED -> ACTIVE on first use.
--
-- KEYS: the standard queue keys (see _lib.lua), then KEYS[12]: the session's binding (a STRING)
-- ARGV[1] visitor key    ARGV[2] sequence number    ARGV[3] fencing token    ARGV[4] now (ms)
-- ARGV[5] the access token's epoch    ARGV[6] its expiry (ms)
-- (all from the access token, whose signature and expiry Python has already checked)
-- ARGV[7] the digest of the browser's secret that presents the token ('' for the site's own server-side
-- check; '?' for a verify without a secret that is not one)
-- ARGV[8] '1' to hand the session over to that browser on purpose
--
-- Returns {result, expires_ms, freed}: result 'valid' | 'expired' | 'superseded' | 'revoked' | 'full' |
-- 'bound_elsewhere' | 'no_config'.
--
-- Binding: the first verify that brings a browser's secret binds the session to it (its digest kept until
-- the session ends); from then on only that browser's requests verify, so one admission's link opened in
-- other browsers is refused ('bound_elsewhere'), and so is a verify without a secret once the session is
-- bound, unless it is the site's own server-side check (issue 50: a recipe that sent none let a shared
-- link in). The protected site may hand a session over (ARGV[8]). A completed session no longer admits:
-- it reads as 'expired'. freed = 1 when an overdue session found here released a slot.
--
-- After lost state (SPEC 3.6), a token of an earlier epoch whose record went with the state starts its
-- session again, until the token's own expiry: a visitor already at the site is not thrown out. While
-- the new epoch holds its slot (epoch.lua, `capacity_now`) it comes back at once; afterwards only into a
-- free slot ('full' otherwise): the slots in use never exceed capacity.

-- How long it took to claim the slot, kept apart for those let in at their joins ('cwj') and from the line
-- ('cwl'): "<mean ms> <count>", the mean of the last ~SERVICE_SPAN (_estimates.lua claim_shift).
local function claim_note(rec, now)
  local field = rec[R_ADMITTED] == rec[R_JOINED] and 'cwj' or 'cwl'
  local v = numbers(redis.call('HGET', K_ST, field) or nil, 2) or {0, 0}
  local n = math.min(v[2] + 1, SERVICE_SPAN)
  local mean = v[1] + (math.max(0, now - rec[R_ADMITTED]) - v[1]) / n
  redis.call('HSET', K_ST, field, fmt(mean) .. ' ' .. fmt(n))
end

local vk, seq, fence, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local binding, rebind = ARGV[7] or '', ARGV[8] == '1'
local K_BIND = KEYS[12]
local p = policy()
if not p then return {'no_config', 0, 0} end

-- Binds a live session to the browser presenting it; false when another browser holds it.
local function bound_here(expires)
  local bound = redis.call('GET', K_BIND)
  if binding == '' then return true end  -- the site checks the token only (a server-side call)
  if binding == '?' then return not bound end  -- no browser's secret: only while nobody is bound
  if bound and bound ~= binding and not rebind then return false end
  if bound ~= binding then redis.call('SET', K_BIND, binding, 'PXAT', math.max(expires, now + 1)) end
  return true
end

local expires = tonumber(ARGV[6]) or 0
if expires > now and restorable(p, vk, seq, tonumber(ARGV[5]) or p.epoch, now) then
  if now >= p.restore_hold_ms and used_slots(p, hash_table(K_ST)) >= p.capacity then return {'full', 0, 0} end
  if not bound_here(expires) then return {'bound_elsewhere', 0, 0} end
  local tid = ticket_id(seq, vk)
  -- admitted when its token says (its end less the session's length), not now: its hold, when it ends,
  -- teaches how long sessions last (service_note), and one read from now taught holds a loss had cut short
  local began = math.max(0, math.min(now, expires - p.session_ttl * 1000))
  save(vk, {seq, ACTIVE, 0, began, math.floor(now / 1000), '', -1, fence, began, now, expires, 0, ''})
  redis.call('ZADD', K_SESSIONS, expires, tid)
  redis.call('HINCRBY', K_ST, 'restored_sessions', 1)
  return {'valid', expires, 0}
end

local rec, reason, freed = session_lookup(p, vk, seq, fence, now)
if reason == 'completed' then reason = 'expired' end
if reason then return {reason, 0, freed} end
if not bound_here(rec[R_EXPIRES]) then return {'bound_elsewhere', 0, 0} end

if rec[R_STATUS] == ADMITTED then
  local tid = ticket_id(seq, vk)
  redis.call('ZREM', K_CLAIMS, tid)
  redis.call('ZADD', K_SESSIONS, rec[R_EXPIRES], tid)
  claim_note(rec, now)  -- how long it took to claim (the holds as the line's)
  rec[R_STATUS] = ACTIVE
  save(vk, rec)
  redis.call('HINCRBY', K_ST, 'activated', 1)
end
return {'valid', rec[R_EXPIRES], 0}
