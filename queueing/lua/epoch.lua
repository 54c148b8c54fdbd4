-- epoch.lua: start a queue's live state for an epoch (SPEC 3.6), or tell that it already runs.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] epoch (the database's)
-- ARGV[2] floor: every sequence number at or below it may have been issued already (the database's
--         reservation before this epoch; 0 for a new queue)
-- ARGV[3] highest sequence number this epoch may issue (the database's reservation, seq_max)
-- ARGV[4] restore until (ms): until then, tickets and sessions of earlier epochs whose records are gone
--         get them back (0: nothing was lost)
-- ARGV[5] hold admissions until (ms): restored sessions take their slots first (0: nothing was lost)
-- ARGV[6..] pairs: sequence number, line score of pre-queue tickets as the shuffle placed them, or 'gone'
--          for a ticket the database noted as finished (it is not restored: _transitions.lua `restorable`)
--
-- Returns 1 when this call started the epoch, 0 when it was live already (a racing starter won).
--
-- The epoch begins on this server (_policy.lua server_id, kept in cfg 'server'): found on another one later
-- (a failover, a restart from the append-only file), the queue's state begins the next epoch
-- (_policy.lua server_moved).
--
-- Sequence numbers never go back: the counter resumes above the floor. Fencing tokens never go back
-- either (there are never more admissions than tickets, so the floor bounds every fence issued), so
-- a session started now supersedes any earlier one. New joiners are placed behind every ticket that
-- may still come back (their numbers are all at or below the floor: join.lua keeps priority placement
-- behind `epoch_floor`).
--
-- Capacity across a loss: the sessions that were live are not known any more, but they were at most
-- capacity. Until `hold`, a new visitor is admitted only into a slot a restored session has left
-- (`capacity_now` in _policy.lua) while their holders come back (each verify restores one); after it, a
-- session comes back only into a free slot (session_start.lua), so the slots in use never exceed capacity.

local epoch, floor, seq_max, restore_until = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local hold = tonumber(ARGV[5])
if redis.call('HGET', K_CFG, 'live_epoch') == epoch then return 0 end

for _, counter in ipairs({'seq', 'fence'}) do
  if (tonumber(redis.call('HGET', K_ST, counter)) or 0) < floor then redis.call('HSET', K_ST, counter, floor) end
end
redis.call('HSET', K_CFG, 'live_epoch', epoch, 'epoch', epoch, 'seq_max', seq_max, 'epoch_floor', floor,
  'restore_until_ms', restore_until, 'restore_hold_until_ms', hold, 'server', server_id())
redis.call('HDEL', K_CFG, 'server_moved')
policy_pack()
redis.call('DEL', K_RESTORE)
for i = 6, #ARGV, 2 do
  redis.call('HSET', K_RESTORE, ARGV[i], ARGV[i + 1])
end
if #ARGV >= 6 then redis.call('PEXPIREAT', K_RESTORE, restore_until) end
return 1
