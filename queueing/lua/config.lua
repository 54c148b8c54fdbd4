-- config.lua: mirror a queue's policy (the database's) into its cfg HASH, where every script reads it.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV: field, value, field, value, ... (the policy; one field is 'epoch', the database's epoch)
--
-- Returns {live_epoch or false, seq or false, taken, changed}: the epoch the live state runs in, its last
-- number, 1 when the policy was taken (0: it was older than the one held, below), and the queue's new state
-- when this write changed it (open, paused, closed; false otherwise, and on a queue's first write): the
-- writer pushes it to every watcher (queueing/realtime.py queue_state), once, whichever process wrote it.
--
-- Epochs only go up. A process holding an older copy of the queue (read before a recovery or a mode
-- switch in another process started the next epoch) writes the rest of the policy but leaves the newer
-- epoch in place: written back, the old one would make the live state look unstarted (every script
-- answering no_config, and visitors told their tickets are gone) until the next sync.
--
-- The state found on another server than its epoch's is not live (so the sync begins the next epoch).

-- Operators' changes only go forward too: the policy carries the database's `revision` (one more per
-- change). A copy older than the one Redis holds (a tick that read the queue before a pause, and wrote
-- after it) keeps only the epoch, the reserved numbers and its sync time; written back whole, it undid the
-- pause until the next tick, and the queue admitted meanwhile. Only for REVISION_GRACE seconds of the
-- writers' clocks, though: a change that Redis took and whose database commit then failed is not the
-- database's, and the database's policy takes its place then.

local REVISION_GRACE = 30
local KEPT_FROM_OLDER = {epoch = true, seq_max = true, synced_at = true, leader_ttl_ms = true}

local given = {}
for i = 1, #ARGV, 2 do given[ARGV[i]] = ARGV[i + 1] end
local held = redis.call('HMGET', K_CFG, 'revision', 'revised_at', 'epoch', 'state')
local held_rev, revised_at, current = tonumber(held[1]) or 0, tonumber(held[2]) or 0, tonumber(held[3]) or 0
local rev = tonumber(given.revision or '') or held_rev
local synced = tonumber(given.synced_at or '') or 0
local older = rev < held_rev and synced - revised_at < REVISION_GRACE

local fields = {}
local whole = not older  -- every field given is written as given
for i = 1, #ARGV, 2 do
  local name = ARGV[i]
  if (not older or KEPT_FROM_OLDER[name]) and (name ~= 'epoch' or (tonumber(ARGV[i + 1]) or 0) >= current) then
    fields[#fields + 1] = name
    fields[#fields + 1] = ARGV[i + 1]
  elseif name == 'epoch' then
    whole = false
  end
end
if not older and rev ~= held_rev then
  fields[#fields + 1] = 'revised_at'
  fields[#fields + 1] = tostring(synced)
  -- the table of waits was the old policy's: polls work theirs out until the next tick makes the model again
  -- (_estimates.lua model_tick)
  redis.call('HDEL', K_ST, 'wt')
end
if #fields > 0 then redis.call('HSET', K_CFG, unpack(fields)) end
-- The policy's digest (services/recovery.py: the tick writes the policy only when Redis does not hold the
-- database's) stands only for a write taken whole, with its digest: a write that was older, kept a newer
-- epoch or came without one (a stateless queue's, whose digest follows its window's write) leaves none,
-- and the next tick writes the policy again.
if not (whole and given.digest) then redis.call('HDEL', K_CFG, 'digest') end
policy_pack()
policy()  -- on another server than its epoch's, the epoch stops being live here (_policy.lua server_moved)
local changed = not older and held[4] and given.state and given.state ~= held[4] and given.state or false
return {redis.call('HGET', K_CFG, 'live_epoch'), redis.call('HGET', K_ST, 'seq'), older and 0 or 1, changed}
