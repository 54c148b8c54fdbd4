-- reorder.lua: put waiting tickets at new places in the line (the pre-queue shuffle at the start).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] now (ms), then pairs: ticket id, new score. Tickets no longer in line are skipped.
-- Returns {tickets moved, event sequence}. The event sequence grows by two, so that every client sees
-- a gap and asks for its new place (a shuffle cannot be told as moves).

line_upgrade()  -- a line kept in one ZSET by the release before (its first tick may come before a sync)
local moved = 0
for i = 2, #ARGV, 2 do
  local tid, score = ARGV[i], tonumber(ARGV[i + 1])
  local vk = vk_of(tid)
  local rec = load(vk)
  if rec and rec[R_STATUS] == WAITING and ticket_id(rec[R_SEQ], vk) == tid then
    local was = line_score_of(rec)
    if was ~= score and line_drop(tid, was) then
      line_add(tid, score)
      line_score_keep(rec, score)
      save(vk, rec)
      moved = moved + 1
    end
  end
end
redis.call('HINCRBY', K_ST, 'evseq', 1)
return {moved, redis.call('HINCRBY', K_ST, 'evseq', 1)}
