-- window/join.lua: a join in stateless mode (SPEC 4, seed 000): the next number, nothing per visitor.
--
-- KEYS[1] win: the queue's window HASH (counters, and the policy mirrored for this mode; see store/window.py)
-- KEYS[2] the solved proof-of-work challenge's single-use marker (when the gate is on)
-- ARGV[1] now (ms)   ARGV[2] proof-of-work bits solved (0: none)   ARGV[3] challenge lifetime (ms)
-- ARGV[4..] the window fields to answer with (store.WINDOW_FIELDS)
--
-- Returns {outcome, {window fields}}: outcome 'created' (the ticket's number is the window's `next`) |
-- 'closed' | 'not_open' | 'full' | 'pow_required' | 'pow_reused' | 'no_config' (the policy or the
-- epoch is not in Redis: sync and retry) | 'no_seq' (the numbers reserved in the database are used up).
--
-- The join is an increment of `next` (HINCRBY). It runs in a script only to refuse numbers beyond the
-- reservation (so none is ever issued twice, even after lost state) and to spend a challenge once.
-- During the pre-queue (before starts_ms) the first number issued is remembered (pq_first): the shuffle
-- at the start covers the numbers pq_first..next (shuffle.place).

local win, now = KEYS[1], tonumber(ARGV[1])
local w = redis.call('HMGET', win, 'live', 'epoch', 'state', 'next', 'max', 'ends_ms', 'prequeue_ms',
  'starts_ms', 'max_waiting', 'active', 'pow', 'gap')
if not w[1] or w[1] ~= w[2] then return {'no_config', {}} end
local nxt, max, active, gap = tonumber(w[4]) or 0, tonumber(w[5]) or 0, tonumber(w[10]) or 0, tonumber(w[12]) or 0
local ends, opens, starts = tonumber(w[6]) or 0, tonumber(w[7]) or 0, tonumber(w[8]) or 0
local fields = {}
for i = 4, #ARGV do fields[#fields + 1] = ARGV[i] end

local function answer(outcome)
  return {outcome, redis.call('HMGET', win, unpack(fields))}
end

if w[3] == 'closed' or (ends > 0 and now >= ends) then return answer('closed') end
if opens > 0 and now < opens then return answer('not_open') end
local max_waiting = tonumber(w[9]) or 0
if max_waiting > 0 and nxt - gap - active >= max_waiting then return answer('full') end
local pow = tonumber(w[11]) or 0
if pow > 0 and (tonumber(ARGV[2]) or 0) < pow then return answer('pow_required') end
if nxt >= max then return answer('no_seq') end
if pow > 0 and not redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then return answer('pow_reused') end

local number = redis.call('HINCRBY', win, 'next', 1)
if starts > now then
  redis.call('HSETNX', win, 'pq_first', number)
elseif number - gap <= active and w[3] == 'open' then
  redis.call('HINCRBY', win, 'admitted', 1)  -- inside the window already: through at once
end
return answer('created')
