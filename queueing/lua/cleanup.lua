-- cleanup.lua: one bounded round of expiry (SPEC 3.4). Run repeatedly until it reports no more work.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] now (ms)    ARGV[2] chunk: most entries looked at per step    ARGV[3] retention (ms) of
-- finished records
--
-- Steps, each bounded by the chunk: (1) admitted tickets past claim_ttl and sessions past their end
-- expire; (2) parked (absent) tickets unseen for abandon_timeout expire, and a cursor walks the line
-- for absent ones admission has not met yet (a walk, not a presence index, keeps a waiting ticket to
-- two entries in Redis: its place and its record); (3) finished records past the retention go.
--
-- Returns {expired_slots, abandoned, pruned, more, moves}: expired_slots and abandoned are ticket ids;
-- more = 1 when a step stopped at its chunk limit or the walk has not reached the end of the line;
-- moves as in _lib.lua.

local now, chunk, retention = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local p = policy()
if not p then return {{}, {}, 0, 0, {0, {}}} end
local more = 0

local expired = expire_slots(now, chunk)
if #expired >= chunk then more = 1 end

local abandoned = {}
local cutoff = '(' .. (math.floor(now / 1000) - p.abandon_timeout)
local away = redis.call('ZRANGEBYSCORE', K_AWAY, '-inf', cutoff, 'LIMIT', 0, chunk)
for _, tid in ipairs(away) do
  local rec = load(vk_of(tid))
  if not rec or rec[R_STATUS] ~= WAITING or ticket_id(rec[R_SEQ], vk_of(tid)) ~= tid then
    redis.call('ZREM', K_AWAY, tid)
  elseif overdue(p, rec, now) then
    finish(tid, rec, EXPIRED, 'abandoned', now)
    abandoned[#abandoned + 1] = tid
  end
end
if #away >= chunk then more = 1 end

local cursor = tonumber(redis.call('HGET', K_ST, 'sweep')) or 0
local batch, scores = line_range(cursor, cursor + chunk - 1)
local removed = 0
for j, tid in ipairs(batch) do
  local rec = load(vk_of(tid))
  if not rec or rec[R_STATUS] ~= WAITING or ticket_id(rec[R_SEQ], vk_of(tid)) ~= tid then
    line_remove(tid, scores[j])
    removed = removed + 1
  elseif overdue(p, rec, now) then
    finish(tid, rec, EXPIRED, 'abandoned', now)
    abandoned[#abandoned + 1] = tid
    removed = removed + 1
  end
end
if #batch < chunk then
  cursor = 0
else
  cursor = cursor + #batch - removed
  more = 1
end
redis.call('HSET', K_ST, 'sweep', cursor)

-- While tickets of an earlier epoch may still come back, finished records stay: they tell a restored
-- ticket's second visit from its first (only a missing record is restored).
local old = {}
if now >= p.restore_until_ms then
  old = redis.call('ZRANGEBYSCORE', K_DONE, '-inf', now - retention, 'LIMIT', 0, chunk)
end
for _, vk in ipairs(old) do
  local rec = load(vk)
  if rec and rec[R_STATUS] > ACTIVE then forget(vk) end
  redis.call('ZREM', K_DONE, vk)
end
if #old >= chunk then more = 1 end

return {expired, abandoned, #old, more, moves_reply()}
