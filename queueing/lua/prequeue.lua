-- prequeue.lua: the tickets waiting in line that joined before a moment (the pre-queue at the start),
-- in line order, for the shuffle. One call reads the whole line (a one-off at the start: about 2 µs of
-- Redis time per ticket).
--
-- KEYS: the standard queue keys (see _lib.lua).   ARGV[1] joined before (ms)
-- Returns {{ticket id, sequence number, priority level}, ...}

local before = tonumber(ARGV[1])
line_upgrade()  -- a line kept in one ZSET by the release before (its first tick may come before a sync)
local out = {}
for _, tid in ipairs((line_range(0, -1))) do
  local rec = load(vk_of(tid))
  if rec and rec[R_STATUS] == WAITING and rec[R_JOINED] < before then
    out[#out + 1] = {tid, rec[R_SEQ], rec[R_PRI]}
  end
end
return out
