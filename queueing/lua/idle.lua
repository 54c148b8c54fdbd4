-- idle.lua: the tick found nobody in the queue (services.admission: nobody waiting, parked, admitted or in a
-- session); from then on it leaves the queue alone (no lease, no admission round) until somebody comes.
-- What the rounds it leaves out would have done is done once, here, as they would have left it: the look
-- at the line forgotten (nobody in line: those who walked away from it no longer weigh on the rates; the
-- next look begins afresh), the curve of slots back drawn for the empty house and marked as such (it holds
-- whenever it is read: lua/_estimates.lua slots_model), no table of waits. 'idle' notes when: the next
-- admission round (lua/admit.lua) takes it that the admission rate did not slow in the meantime, and the
-- estimate reads that rate as it was (issue 49; the rounds were left out once before, and the first burst
-- after an hour's quiet was told the curve of an hour ago).
--
-- KEYS: the standard queue keys (see _lib.lua).   ARGV[1] now (ms)
-- Returns 1 when noted, 0 when somebody is in the queue (the next tick runs its round).

local now = tonumber(ARGV[1])
local p = policy()
if not p or p.mode == 'stateless' then return 0 end
if line_count() > 0 or redis.call('ZCARD', K_CLAIMS) > 0 or redis.call('ZCARD', K_SESSIONS) > 0
  or redis.call('ZCARD', K_AWAY) > 0 then
  return 0
end
local st = hash_table(K_ST)
look_forgotten(st)
returns_look(p, st, now, true)
redis.call('HDEL', K_ST, 'wt')
redis.call('HSET', K_ST, 'idle', now)
return 1
