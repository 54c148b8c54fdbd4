-- window/read.lua: a stateless queue's window in one read (what a plain HMGET gives), so that it can run
-- in one script with the asking ticket's rate limiter (store.combined).
--
-- KEYS[1] win   ARGV: the fields to read
-- Returns their values, in order (nil for a field not set).

return redis.call('HMGET', KEYS[1], unpack(ARGV))
