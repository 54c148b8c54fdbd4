-- finished.lua: the tickets finished (left, expired, completed, revoked) since a cursor, for the database
-- to note, so that after lost state they are not given back a place or a session (SPEC 3.6).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] most tickets to return
--
-- Returns {cursor, {seq, ...}}: the sequence numbers of tickets finished after the cursor kept in st
-- (`finished_noted_ms`), oldest first, and the new cursor (the last one's end time), which this call
-- stores: the caller notes them in the database before the next call, or they are noted never (a lost
-- call loses at most one batch of the journal; the worst that costs is a finished ticket restored).

local limit = tonumber(ARGV[1])
local since = tonumber(redis.call('HGET', K_ST, 'finished_noted_ms')) or 0
local done = redis.call('ZRANGEBYSCORE', K_DONE, '(' .. since, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local seqs = {}
local cursor = since
for i = 1, #done, 2 do
  local rec = load(done[i])
  if rec then seqs[#seqs + 1] = rec[R_SEQ] end
  cursor = tonumber(done[i + 1])
end
if cursor > since then redis.call('HSET', K_ST, 'finished_noted_ms', cursor) end
return {cursor, seqs}
