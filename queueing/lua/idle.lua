-- idle.lua: the tick found nobody in the queue (services.admission: nobody waiting, parked, admitted or in a
-- session); from then on it leaves the queue alone (no lease, no admission round) until somebody comes.
-- What the rounds it leaves out would have done is done once, here, as they would have left it: the look
-- at the line faded out, the curve of slots back drawn for the empty house and marked as such (it holds
-- whenever it is read: lua/_estimates.lua slots_model), no table of waits. Only once the look has faded as
-- the rounds fade it (about 45 s of them with nobody in line: a queue empty for a moment between two waves
-- keeps what its line taught it): until then, 0, and the tick runs its round. 'idle' notes when, and
-- 'idle_of' for which mirror of the policy (ARGV[2], its digest): a policy changed while the queue is idle
-- (its capacity, its session length, a switch of mode) has it noted again, the curve drawn for it. The next
-- admission round (lua/admit.lua) takes it that the admission rate did not slow meanwhile, and the
-- estimate reads that rate as it was (issue 49; the rounds were left out once before, and the first burst
-- after an hour's quiet was told the curve of an hour ago).
--
-- KEYS: the standard queue keys (see _lib.lua).   ARGV[1] now (ms)   ARGV[2] the mirror's digest
-- Returns 1 when noted, 0 when not (somebody is in the queue, the look is still fading, no policy): the
-- tick runs its round.

local now = tonumber(ARGV[1])
local p = policy()
if not p or p.mode == 'stateless' then return 0 end
if line_count() > 0 or redis.call('ZCARD', K_CLAIMS) > 0 or redis.call('ZCARD', K_SESSIONS) > 0
  or redis.call('ZCARD', K_AWAY) > 0 then
  return 0
end
if redis.call('HEXISTS', K_ST, 'hzl') == 1 then return 0 end  -- (the rounds drop it once faded)
look_forgotten()
local st = hash_table(K_ST)
returns_look(p, st, now, true)
redis.call('HDEL', K_ST, 'wt', 'wto')
redis.call('HSET', K_ST, 'idle', st.idle or now, 'idle_of', ARGV[2])
return 1
