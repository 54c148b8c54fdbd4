-- sliding_log.lua: a log of request times; a request passes if fewer than `max` are logged in the
-- last `window` ms. As in seed 002, a refused request is logged too (a client that keeps hammering stays
-- refused), unless keep_refused is 0. The log never holds more than 2 x max entries.
--
-- KEYS[1] ZSET member = unique id, score = time (ms)
-- ARGV: now (ms), window (ms), max, member (unique per request), keep_refused 0|1
-- Returns {allowed 0|1, retry after (ms), requests left (string), 0}

local now, window, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local member, keep_refused = ARGV[4], ARGV[5] == '1'
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)  -- the window is (now - window, now]
local n = redis.call('ZCARD', KEYS[1])
local allowed = n < max
if allowed or keep_refused then
  redis.call('ZADD', KEYS[1], now, member)
  n = n + 1
  if n > 2 * max then
    redis.call('ZREMRANGEBYRANK', KEYS[1], 0, n - 2 * max - 1)  -- oldest first
    n = 2 * max
  end
  redis.call('PEXPIRE', KEYS[1], window + 1000)
end
if allowed then return {1, 0, tostring(max - n), 0} end
-- Refused: the next request passes once all but max - 1 of the logged ones have aged out.
local entry = redis.call('ZRANGE', KEYS[1], n - max, n - max, 'WITHSCORES')
local retry = 1
if entry[2] then retry = math.max(1, tonumber(entry[2]) + window - now) end
return {0, retry, '0', 0}
