-- leaking_bucket.lua: a FIFO queue of at most `size` requests, processed at `rate` a second. A request
-- joins the queue if there is room, else it is refused. The queue is kept as the moment it will be
-- empty (`empty_at`): requests in it = (empty_at - now) * rate.
--
-- KEYS[1] STRING empty_at (ms)     ARGV: now (ms), size, rate (requests/s)
-- Returns {allowed 0|1, retry after (ms), places left (string), wait (ms): when this request's turn
-- comes (0 = at once), for callers that pace their work}

local now, size, rate = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local interval = 1000 / rate
local empty_at = tonumber(redis.call('GET', KEYS[1])) or now
if empty_at < now then empty_at = now end
local queued = (empty_at - now) / interval
if queued + 1 > size + 1e-9 then
  return {0, math.ceil((queued + 1 - size) * interval), string.format('%.17g', math.max(0, size - queued)), 0}
end
local wait = empty_at - now
empty_at = empty_at + interval
redis.call('SET', KEYS[1], string.format('%.17g', empty_at), 'PX', math.ceil(empty_at - now) + 1000)
return {1, 0, string.format('%.17g', size - queued - 1), math.floor(wait)}
