-- token_bucket.lua: a bucket of `capacity` tokens refilled at `rate` tokens a second; a request takes
-- `cost` tokens or is refused. Refill is computed from elapsed time (no timer).
--
-- KEYS[1] HASH {tokens, ts}     ARGV: now (ms), capacity, rate (tokens/s), cost
-- Returns {allowed 0|1, retry after (ms), tokens left (string), 0}

local now, capacity, rate, cost = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
local tokens, ts = tonumber(state[1]), tonumber(state[2])
if tokens == nil then tokens, ts = capacity, now end
if now > ts then  -- a clock behind the last caller's refills nothing (and takes nothing back)
  tokens = math.min(capacity, tokens + (now - ts) / 1000 * rate)
  ts = now
end
local allowed, retry = 0, 0
if tokens >= cost then
  tokens = tokens - cost
  allowed = 1
else
  retry = math.ceil((cost - tokens) / rate * 1000)
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', tokens), 'ts', string.format('%.17g', ts))
redis.call('PEXPIRE', KEYS[1], math.ceil(capacity / rate * 1000) + 1000)  -- full again: forget it
return {allowed, retry, string.format('%.17g', tokens), 0}
