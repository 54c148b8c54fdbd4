-- sliding_window_counter.lua: fixed windows of `fw` ms counted, and a rolling window of `rw` ms
-- (fw <= rw <= 2 fw) estimated as this window's count plus the previous window's count weighted by how
-- much of the previous window the rolling window overlaps (seed 002's example: 3 in this window, 7 in
-- the previous one, 70 % overlap: 3 + 7 x 0.7 = 7.9; the seed prints 6.5, which is 3 + 5 x 0.7). The estimate
-- is rounded down, up, or not at all (`rounding`) before the check count + 1 <= max.
--
-- KEYS[1] HASH {window, current, previous}
-- ARGV: now (ms), fw (ms), rw (ms), max, rounding 'down'|'up'|'none'
-- Returns {allowed 0|1, retry after (ms), the weighted count before this request (string), 0}

local now, fw, rw, max = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local rounding = ARGV[5]
local index = math.floor(now / fw)
local state = redis.call('HMGET', KEYS[1], 'window', 'current', 'previous')
local window, current, previous = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
if window == nil or index > window + 1 then
  current, previous = 0, 0
elseif index == window + 1 then
  current, previous = 0, current
elseif index < window then
  index = window  -- a clock behind the last caller's: count it in the newest window
end

local function weight(elapsed)  -- share of the previous window inside the rolling window
  return math.max(0, math.min(fw, rw - elapsed)) / fw
end

local function rounded(x)
  if rounding == 'down' then return math.floor(x + 1e-9) end
  if rounding == 'up' then return math.ceil(x - 1e-9) end
  return x
end

local start = index * fw
local count = current + previous * weight(now - start)
if rounded(count) + 1 <= max then
  redis.call('HSET', KEYS[1], 'window', index, 'current', current + 1, 'previous', previous)
  redis.call('PEXPIRE', KEYS[1], 2 * fw + rw)
  return {1, 0, string.format('%.17g', count), 0}
end

-- Refused: the earliest moment (with no other request) this check would pass. The previous window's
-- weight falls linearly; at the next window this one becomes the previous.
local function first_pass(cur, prev, from)  -- elapsed time in a window with these counts, or nil
  local room = max - 1 - cur  -- how much of prev may still count
  if rounding == 'down' then room = max - cur - 1e-6 end
  if room < 0 then return nil end
  if prev * weight(from) <= room then return from end
  -- prev * (rw - e) / fw <= room  =>  e >= rw - room * fw / prev
  local e = rw - room * fw / prev
  if e < fw then return math.max(from, e) end
  return nil
end
local e = first_pass(current, previous, now - start)
local retry
if e ~= nil then
  retry = start + e - now
else
  e = first_pass(0, current, 0) or fw
  retry = start + fw + e - now
end
return {0, math.max(1, math.ceil(retry)), string.format('%.17g', count), 0}
