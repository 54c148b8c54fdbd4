-- config.lua: mirror a queue's policy (the database's) into its cfg HASH, where every script reads it.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV: field, value, field, value, ... (the policy; one field is 'epoch', the database's epoch)
--
-- Returns {live_epoch or false, seq or false}: the epoch the live state runs in, and its last number.
--
-- Epochs only go up. A process holding an older copy of the queue (read before a recovery or a mode
-- switch in another process started the next epoch) writes the rest of the policy but leaves the newer
-- epoch in place: written back, the old one would make the live state look unstarted (every script
-- answering no_config, and visitors told their tickets are gone) until the next sync.
--
-- The state found on another server than its epoch's is not live (so the sync begins the next epoch).

local current = tonumber(redis.call('HGET', K_CFG, 'epoch')) or 0
local fields = {}
for i = 1, #ARGV, 2 do
  if ARGV[i] ~= 'epoch' or (tonumber(ARGV[i + 1]) or 0) >= current then
    fields[#fields + 1] = ARGV[i]
    fields[#fields + 1] = ARGV[i + 1]
  end
end
if #fields > 0 then redis.call('HSET', K_CFG, unpack(fields)) end
policy_pack()
policy()  -- on another server than its epoch's, the epoch stops being live here (_lib.lua server_moved)
return {redis.call('HGET', K_CFG, 'live_epoch'), redis.call('HGET', K_ST, 'seq')}
