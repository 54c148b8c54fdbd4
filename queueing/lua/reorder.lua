-- reorder.lua: put waiting tickets at new places in the line (the pre-queue shuffle at the start).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] now (ms), then pairs: ticket id, new score. Tickets no longer in line are skipped.
-- Returns {tickets moved, event sequence}. The event sequence grows by two, so that every client sees
-- a gap and asks for its new place (a shuffle cannot be told as moves).

local moved = 0
for i = 2, #ARGV, 2 do
  moved = moved + redis.call('ZADD', KEYS[3], 'XX', 'CH', ARGV[i + 1], ARGV[i])
end
redis.call('HINCRBY', KEYS[2], 'evseq', 1)
return {moved, redis.call('HINCRBY', KEYS[2], 'evseq', 1)}
