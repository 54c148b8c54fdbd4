-- notices.lua: one run of a queue's turn notices (services/notices.py), whose work does not grow with the
-- notices kept: the noticed tickets that left the line since (`notice_due`, oldest first), and those near
-- the head whose nearness is not told yet. Near: within the first `places`, or with a wait of at most
-- `seconds` off the tick's table of waits (_estimates.lua, waits_read; none while the table is not in use:
-- paused, closed, a start's draw to come). The head is walked as far as near reaches (ranks read by the
-- line's buckets, the noticed set asked a chunk at a time), or, when fewer noticed tickets wait to be told
-- than a quarter of that reach, each one's rank is read: either way at most what near reaches.
--
-- KEYS: the standard queue keys (see _lib.lua), then KEYS[12] noticed (ZSET), KEYS[13] notice_due (LIST).
-- ARGV[1] now (ms)    ARGV[2] places    ARGV[3] seconds (0: by places only)    ARGV[4] most due ids read
--
-- Returns {state, mode, seeded 0|1, due ids, near ids}, or {'no_config'}. seeded: the
-- queue's live state has had its notices kept since it began ('notices_seeded' in st, set by the run
-- after it kept them again: services/notices.py); 0 after lost state, or before the first run.

local now, places, seconds, most = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local K_NOTICED, K_DUE = KEYS[12], KEYS[13]
local CHUNK = 512

local p = policy()
if not p then return {'no_config'} end
local seeded = redis.call('HGET', K_ST, 'notices_seeded') and 1 or 0
local due = redis.call('LRANGE', K_DUE, 0, most - 1)
local near = {}

-- How far near reaches: every rank below it (places; then as far as the table's wait is within seconds).
local function reach()
  local far = math.min(places, line_count())
  if seconds <= 0 or far >= line_count() then return far end
  local st = poll_stats()
  local function within(rank)
    local w = waits_read(p, st, rank, now)
    return w ~= nil and w >= 0 and w <= seconds
  end
  if not within(far) then return far end
  local lo, hi = far, far * 2 + 1  -- within(lo): the first rank not within is above it
  while hi < line_count() and within(hi) do lo, hi = hi, hi * 2 + 1 end
  hi = math.min(hi, line_count())
  while hi - lo > 1 do
    local mid = lo + math.floor((hi - lo) / 2)
    if within(mid) then lo = mid else hi = mid end
  end
  return lo + 1
end

local untold = redis.call('ZCOUNT', K_NOTICED, 0, 0)
local drawing = p.shuffle_pending and now < p.starts_at_ms
if untold > 0 and p.mode ~= 'stateless' and p.state ~= 'closed' and not drawing then
  local far = reach()
  if untold * 4 < far then  -- few: each one's place
    for _, tid in ipairs(redis.call('ZRANGE', K_NOTICED, 0, 0, 'BYSCORE')) do
      local vk = vk_of(tid)
      local rec = load(vk)
      if rec and rec[R_STATUS] == WAITING and ticket_id(rec[R_SEQ], vk) == tid then
        local rank = line_rank(tid, line_score_of(rec))
        if rank and rank < far then near[#near + 1] = tid end
      end
    end
  else  -- many: the head, against the set
    local start = 0
    while start < far do
      local batch = line_range(start, math.min(far, start + CHUNK) - 1)
      if #batch == 0 then break end
      local told = redis.call('ZMSCORE', K_NOTICED, unpack(batch))
      for i, tid in ipairs(batch) do
        if told[i] == '0' then near[#near + 1] = tid end
      end
      start = start + #batch
    end
  end
end
return {p.state, p.mode, seeded, due, near}
