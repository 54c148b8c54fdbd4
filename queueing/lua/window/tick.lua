-- window/tick.lua: one step of the stateless window (SPEC 4, seed 000).
--
-- KEYS[1] win: the queue's window HASH    KEYS[2] the queue's admission leader lease (as leader.lua)
-- ARGV[1] now (ms)    ARGV[2] the leader token ('' to step without the lease: tests and tools only)
--
-- Returns {outcome, stepped, active, issued, at, evseq}: outcome 'ok' | 'not_leader' | 'no_config';
-- stepped = 1 when the window moved; active = the last active place; issued = the last number issued,
-- as a place (next - gap); at = when the window last moved (ms).
--
-- Places: a ticket's place is its number less the gap of its epoch (numbers skipped after lost state,
-- see services.queue_live_state_ensure); a pre-queue ticket's place comes from the shuffle.
-- The window moves by `size` places once `interval` has passed since it last moved, while it does not
-- already pass the next place to be issued (active <= issued): on an idle line the next `size` joiners are
-- active at once, and the window waits for them rather than running ahead. It moves only while the queue
-- admits (open, started, shuffled, not ended) and, with reported capacity, while the site has room. One
-- step per tick, however long since the last: a stalled tick never releases a burst.

local win, now, token = KEYS[1], tonumber(ARGV[1]), ARGV[2]
if token ~= '' and redis.call('GET', KEYS[2]) ~= token then return {'not_leader', 0, 0, 0, 0, 0} end
local w = redis.call('HMGET', win, 'live', 'epoch', 'state', 'next', 'active', 'at', 'interval_ms', 'size',
  'starts_ms', 'ends_ms', 'shuffle_pending', 'capacity_source', 'capacity', 'reported_in_use', 'gap',
  'ema_rate', 'ema_ts', 'evseq')
if not w[1] or w[1] ~= w[2] then return {'no_config', 0, 0, 0, 0, 0} end

local issued = (tonumber(w[4]) or 0) - (tonumber(w[15]) or 0)
local active, at = tonumber(w[5]) or 0, tonumber(w[6]) or 0
local interval, size = tonumber(w[7]) or 10000, tonumber(w[8]) or 1
local starts, ends = tonumber(w[9]) or 0, tonumber(w[10]) or 0
local evseq = tonumber(w[18]) or 0

local admitting = w[3] == 'open' and now >= starts and w[11] ~= '1' and (ends == 0 or now < ends)
if admitting and w[12] == 'reported' and (tonumber(w[14]) or 0) >= (tonumber(w[13]) or 1) then
  admitting = false  -- the site says it is full
end

local stepped = 0
if admitting and now - at >= interval and active <= issued then
  local let_in = math.min(active + size, issued) - math.min(active, issued)
  active = active + size
  -- Admissions per second (EMA, time constant 30 s), as the tracked scripts keep it; counts the numbers
  -- that existed when the window passed them (later joiners inside the window are counted at join).
  local ema, ts = tonumber(w[16]) or 0, tonumber(w[17]) or now
  if now > ts then ema = ema * math.exp(-(now - ts) / 30000) end
  ema = ema + let_in / 30
  evseq = redis.call('HINCRBY', win, 'evseq', 1)
  redis.call('HSET', win, 'active', active, 'at', now, 'ema_rate', string.format('%.17g', ema),
    'ema_ts', math.max(ts, now))
  redis.call('HINCRBY', win, 'admitted', let_in)
  stepped, at = 1, now
end
return {'ok', stepped, active, issued, at, evseq}
