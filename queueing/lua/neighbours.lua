-- neighbours.lua: the few visitors around one waiting visitor, for the picture of the line (seed 004),
-- fetched in one call (one range of the line, then their records).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key    ARGV[2] sequence number (from the signed ticket)
-- ARGV[3] how many ahead    ARGV[4] how many behind    ARGV[5] now (ms)
--
-- Returns {rank, {{rank, display name, is_me, priority}, ...}} in line order, or {-1, {}} when the
-- ticket is not in line. Other visitors are shown by display name only (never their ticket ids).
-- Before a scheduled start the pre-queue's order is not drawn yet (status says no place): {rank, {}}.

local vk, seq = ARGV[1], tonumber(ARGV[2])
local before, after, now = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local rec = load(vk)
if not rec or rec[R_SEQ] ~= seq or rec[R_STATUS] ~= WAITING then return {-1, {}} end
local tid = ticket_id(seq, vk)
local rank = line_rank(tid, line_score_of(rec))
if not rank then return {-1, {}} end
local p = policy()
if p and p.starts_at_ms > now then return {rank, {}} end

local first = math.max(0, rank - before)
local members = line_range(first, rank + after)
local out = {}
for i, member in ipairs(members) do
  local name, priority = '', 0
  local r = load(vk_of(member))
  if r then name, priority = r[R_NAME] or '', r[R_PRI] or 0 end
  out[#out + 1] = {first + i - 1, name, member == tid and 1 or 0, priority}
end
return {rank, out}
