-- fixed_window.lua: time cut into windows of `window` ms; each window lets `max` requests through.
-- (Known weakness, kept on purpose: up to 2 x max can pass around a window boundary.)
--
-- KEYS[1] HASH {window, count}     ARGV: now (ms), window (ms), max
-- Returns {allowed 0|1, retry after (ms), requests left in this window (string), 0}

local now, size, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local index = math.floor(now / size)
local state = redis.call('HMGET', KEYS[1], 'window', 'count')
local count = tonumber(state[2]) or 0
if tonumber(state[1]) ~= index then count = 0 end
local window_end = (index + 1) * size
if count >= max then
  return {0, math.max(1, window_end - now), '0', 0}
end
count = count + 1
redis.call('HSET', KEYS[1], 'window', index, 'count', count)
redis.call('PEXPIRE', KEYS[1], math.ceil(window_end - now) + 1000)
return {1, 0, tostring(max - count), 0}
