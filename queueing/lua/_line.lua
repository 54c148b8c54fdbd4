-- _line.lua: the line in buckets, and a place in it found by counting (part of the library: _lib.lua).
--!exports: LINE_LAYOUT line_count line_score_of line_score_keep line_add line_rank line_has line_drop
--!exports: line_remove line_range
-- (A line kept before the buckets moves into them: _line_upgrade.lua.)

-- The line (KEYS[3] names it): waiting tickets in order of score, then ticket id, kept in buckets. A
-- bucket `line:<b>` is a ZSET of the scores in [b x LINE_WIDTH, (b + 1) x LINE_WIDTH), small enough that
-- Redis keeps it a listpack: about 40 B an entry, where one ZSET of everyone costs 128 (a skiplist node, a
-- dictionary entry and the member on its own; bench/RESULTS.md). Two small indexes find a place in it:
--   line:i  ZSET  the buckets that hold anyone (member and score: b), to walk them in order
--   line:f  HASH  'n': everyone in line; 'head', 'tail': the first and last buckets; 'hn': the first
--                 bucket's entries; 'base': the first bucket the count tree counts; 'pad' (TREE_PAD);
--                 and the tree (Fenwick): field i holds the entries of buckets base + i - lowbit(i) ..
--                 base + i - 1, the head's and the tail's excepted. The entries ahead of a bucket are the
--                 head's and a sum of at most LINE_BITS fields (one HMGET); ahead of the head's, none;
--                 ahead of the tail's, n less its own.
-- The two ends are kept out of the tree so that a join at the back and an admission at the front (most
-- changes) write no tree field: an end's count goes into the tree once, when a bucket beyond it starts,
-- and comes out when it becomes an end again (about every LINE_WIDTH joins or admissions).
-- The bucket is a non-decreasing function of the score (clamped at both ends), so the buckets in order,
-- each in its own order, are the line in order. A waiting ticket's score is its sequence number unless
-- its record says otherwise (R_LINE_SCORE: a priority joiner's place, the shuffle's, a restored one's),
-- so its bucket is found from the record, never by search.
local LINE_WIDTH = 64  -- level 0 joiners fill a bucket half; priority joiners placed among them, the rest
local LINE_BITS = 16
local LINE_SIZE = 2 ^ LINE_BITS  -- buckets the tree counts, from its base: 4.2 million places of score
LINE_LAYOUT = 2  -- cfg 'line_layout': 2 = buckets; a policy packed before them is not live (upgrade)

-- The base is set when the line starts from empty, at the first score's bucket; it moves down when a
-- score comes from below it (line_rebase) and stays otherwise while anyone is in line: buckets are a
-- function of the score only while it stays. A score beyond the tree's reach (or below 0) shares the
-- bucket at that end, in order still, only less compact. A place's tree fields are the set bits of
-- (b - base): a base at the first bucket keeps them few.
-- BASES: the base each line had when it was last read (the library's, across calls: at most BASES_KEPT,
-- then they start again), so a poll reads the line's figures and its tree fields in one HMGET.
local BASES, BASES_KEPT, bases_kept = {}, 4096, 0

-- This call's copy of line:f's n, head, tail, hn and base (LINE; bind() forgets it).

local function meta_read(v)
  LINE = {n = tonumber(v[1]) or 0, head = tonumber(v[2]), tail = tonumber(v[3]), base = tonumber(v[4]),
          hn = tonumber(v[5]) or 0}
  if LINE.base and BASES[K_LINE] ~= LINE.base then
    if bases_kept >= BASES_KEPT then BASES, bases_kept = {}, 0 end
    BASES[K_LINE], bases_kept = LINE.base, bases_kept + 1
  end
  return LINE
end

local function line_meta()
  if LINE == nil then meta_read(redis.call('HMGET', K_LINE_F, 'n', 'head', 'tail', 'base', 'hn')) end
  return LINE
end

-- Everyone in line.
function line_count()
  return line_meta().n
end

local function bucket_of(score, base)
  local b = math.floor(score / LINE_WIDTH)
  if base == nil then return math.max(0, b) end  -- nobody in line: the first to come sets the base
  if b < base then return base end
  if b >= base + LINE_SIZE then return base + LINE_SIZE - 1 end
  return b
end

local function line_bucket(score)
  return bucket_of(score, line_meta().base)
end

-- Bucket keys by line and bucket (a number's text is printf's work: 0.28 µs a poll); 20,000, then again.
local BUCKET_KEYS, bucket_keys_kept = {}, 0

local function bucket_key(b)
  local keys = BUCKET_KEYS[K_LINE]
  if keys and keys[b] then return keys[b] end
  if bucket_keys_kept >= 20000 then BUCKET_KEYS, bucket_keys_kept, keys = {}, 0, nil end
  if not keys then keys = {} BUCKET_KEYS[K_LINE] = keys end
  keys[b], bucket_keys_kept = K_LINE .. ':' .. b, bucket_keys_kept + 1
  return keys[b]
end

-- A field longer than any listpack's value (hash-max-listpack-value, 64 by default) keeps line:f a
-- hashtable: as a listpack (up to hash-max-listpack-entries fields, 512 on some builds) each field read
-- is a scan of them all, which cost a poll 6 µs with 326 fields.
local TREE_PAD = '----------------------------------------------------------------' -- 256 bytes, by hand:
TREE_PAD = TREE_PAD .. TREE_PAD .. TREE_PAD .. TREE_PAD  -- the library's load has no string library

-- The tree's fields to read for the entries before slot i (none for slot 0), and to write for a change at
-- slot i: lists of field names (text) kept by the library, so a poll builds none (1.4 µs of a poll's
-- place; at most TREE_PATHS_KEPT of each, then they start again).
local READ_PATHS, WRITE_PATHS, TREE_PATHS_KEPT, tree_paths_kept = {}, {}, 20000, 0

local function tree_path(paths, i, step)
  local path = paths[i]
  if path then return path end
  path = {}
  local at = i
  while at > 0 and at <= LINE_SIZE do
    path[#path + 1] = string.format('%d', at)
    at = at + step * bit.band(at, -at)
  end
  if tree_paths_kept >= TREE_PATHS_KEPT then READ_PATHS, WRITE_PATHS, tree_paths_kept = {}, {}, 0 end
  paths[i], tree_paths_kept = path, tree_paths_kept + 1
  return path
end

-- The tree's count of bucket b changes by delta. A field that comes to 0 goes.
local function tree_add(b, delta)
  local fields = tree_path(WRITE_PATHS, b - LINE.base + 1, 1)
  local values = redis.call('HMGET', K_LINE_F, unpack(fields))
  local set, drop = {}, {}
  for j, field in ipairs(fields) do
    local v = (tonumber(values[j]) or 0) + delta
    if v == 0 then
      drop[#drop + 1] = field
    else
      set[#set + 1] = field
      set[#set + 1] = v
    end
  end
  if #set > 0 then redis.call('HSET', K_LINE_F, unpack(set)) end
  if #drop > 0 then redis.call('HDEL', K_LINE_F, unpack(drop)) end
end

-- The entries in buckets before b, from the tree fields read for it (values[first] on).
local function before_from(meta, b, values, first)
  if b == meta.head then return 0 end
  if b == meta.tail then return meta.n - redis.call('ZCARD', bucket_key(b)) end
  local sum = meta.hn
  for j = first, #values do sum = sum + (tonumber(values[j]) or 0) end
  return sum
end

-- The entries in buckets before b.
local function line_before(b)
  local meta = line_meta()
  local path = tree_path(READ_PATHS, b - meta.base, -1)
  if b == meta.head or b == meta.tail or #path == 0 then return before_from(meta, b, path, 1) end
  return before_from(meta, b, redis.call('HMGET', K_LINE_F, unpack(path)), 1)
end

-- The bucket holding the entry at `rank` (0-based, < line_count()), and the entries before that bucket.
local function bucket_at(rank)
  local meta = line_meta()
  local first = meta.hn
  if rank < first then return meta.head, 0 end
  -- (the tree's fields and the tail's count, as read since the line last changed: the tick's looks and
  -- table find some ninety places a call, each reading the tree's top fields again)
  local seen = meta.seen
  if not seen then
    seen = {tail = redis.call('ZCARD', bucket_key(meta.tail))}
    meta.seen = seen
  end
  local in_tree = meta.n - seen.tail
  if rank >= in_tree then return meta.tail, in_tree end
  -- Halving from the least power of two past the tail's slot, not from LINE_SIZE: every field above it
  -- counts the whole tree, more than `left`, and is never taken (17 reads a place were 5 in a line of 16
  -- buckets: the tick's looks and table find some eighty places a second).
  local pos, left, step = 0, rank - first, 1
  while step < meta.tail - meta.base + 1 and step < LINE_SIZE do step = step * 2 end
  while step >= 1 do
    local at = pos + step
    if at <= LINE_SIZE then
      local v = seen[at]
      if v == nil then
        v = tonumber(redis.call('HGET', K_LINE_F, string.format('%d', at))) or 0
        seen[at] = v
      end
      if v <= left then pos, left = at, left - v end
    end
    step = step / 2
  end
  return meta.base + pos, rank - left
end

-- A waiting ticket's score: its sequence number unless its record keeps another.
function line_score_of(rec)
  return rec[R_LINE_SCORE] or rec[R_SEQ]
end

-- Keep `score` in the record when it is not the sequence number (false holds the places before it:
-- msgpack keeps an array without holes); a record back at its sequence number loses the field.
function line_score_keep(rec, score)
  if score ~= rec[R_SEQ] then
    while #rec < R_LINE_SCORE - 1 do rec[#rec + 1] = false end
    rec[R_LINE_SCORE] = score
  elseif rec[R_LINE_SCORE] then
    rec[R_LINE_SCORE] = false
    while #rec > R_EST and not rec[#rec] do rec[#rec] = nil end
  end
end

-- An end moves to bucket b: the bucket that was the end goes into the tree, unless it is the other end.
local function end_moves(which, b)
  local meta = line_meta()
  local was = meta[which]
  if meta.head ~= meta.tail then tree_add(was, redis.call('ZCARD', bucket_key(was))) end
  meta[which] = b
  if which == 'head' then
    meta.hn = 0
    redis.call('HSET', K_LINE_F, 'head', b, 'hn', 0)
  else
    redis.call('HSET', K_LINE_F, 'tail', b)
  end
end

-- An end's bucket emptied: the next bucket inwards (`toward` 1: after it, -1: before it) is that end
-- now, and comes out of the tree, unless it is the other end already.
local function end_emptied(which, b, toward)
  local meta = line_meta()
  local found
  if toward > 0 then
    found = redis.call('ZRANGE', K_LINE_I, '(' .. b, '+inf', 'BYSCORE', 'LIMIT', 0, 1)
  else
    found = redis.call('ZRANGE', K_LINE_I, '(' .. b, '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, 1)
  end
  local inward = tonumber(found[1])
  local count = redis.call('ZCARD', bucket_key(inward))
  if inward ~= meta.head and inward ~= meta.tail then tree_add(inward, -count) end
  meta[which] = inward
  if which == 'head' then
    meta.hn = count
    redis.call('HSET', K_LINE_F, 'head', inward, 'hn', count)
  else
    redis.call('HSET', K_LINE_F, 'tail', inward)
  end
end

-- A score came from below the base (a parked visitor of long ago, a ticket restored after lost state, a
-- premium joiner ahead of the first): the base moves down to a little below its bucket. Entries kept in
-- the old base's bucket only because they were below it go to their own buckets, and the tree is written
-- again from the bucket counts (once: a few fields a bucket). Not when the line would then reach past
-- the tree: the score then shares the base's bucket (in order still).
local function line_rebase(low)
  local meta = LINE
  local base = math.max(0, low - LINE_WIDTH)  -- room below for more of the same
  if base >= meta.base or meta.tail - base >= LINE_SIZE then return end
  local old = bucket_key(meta.base)
  local below = redis.call('ZRANGE', old, '-inf', '(' .. (meta.base * LINE_WIDTH), 'BYSCORE', 'WITHSCORES')
  for i = 1, #below, 2 do
    local to = bucket_of(tonumber(below[i + 1]), base)
    redis.call('ZREM', old, below[i])
    redis.call('ZADD', bucket_key(to), below[i + 1], below[i])
    redis.call('ZADD', K_LINE_I, to, to)
  end
  if #below > 0 and redis.call('EXISTS', old) == 0 then redis.call('ZREM', K_LINE_I, meta.base) end
  meta.base = base
  meta.head = tonumber(redis.call('ZRANGE', K_LINE_I, 0, 0)[1])
  meta.tail = tonumber(redis.call('ZRANGE', K_LINE_I, -1, -1)[1])
  meta.hn = redis.call('ZCARD', bucket_key(meta.head))
  local tree, slots = {}, {}
  for _, name in ipairs(redis.call('ZRANGE', K_LINE_I, 0, -1)) do
    local b = tonumber(name)
    if b ~= meta.head and b ~= meta.tail then
      local count, i = redis.call('ZCARD', bucket_key(b)), b - base + 1
      while i <= LINE_SIZE do
        if tree[i] == nil then
          tree[i] = 0
          slots[#slots + 1] = i
        end
        tree[i] = tree[i] + count
        i = i + bit.band(i, -i)
      end
    end
  end
  redis.call('DEL', K_LINE_F)
  redis.call('HSET', K_LINE_F, 'n', meta.n, 'head', meta.head, 'tail', meta.tail, 'hn', meta.hn, 'base', base,
    'pad', TREE_PAD)
  for first = 1, #slots, 500 do
    local set = {}
    for j = first, math.min(first + 499, #slots) do
      set[#set + 1] = string.format('%d', slots[j])
      set[#set + 1] = tree[slots[j]]
    end
    redis.call('HSET', K_LINE_F, unpack(set))
  end
end

function line_add(tid, score)
  local meta = line_meta()
  meta.seen = nil
  if meta.n > 0 and math.floor(score / LINE_WIDTH) < meta.base then line_rebase(math.floor(score / LINE_WIDTH)) end
  local b = line_bucket(score)
  local key = bucket_key(b)
  local fresh = false  -- a bucket nobody was in
  if meta.n == 0 then  -- the line starts again: a new base and ends, an empty tree
    redis.call('DEL', K_LINE_F)
    meta.base, meta.head, meta.tail, meta.hn, fresh = b, b, b, 0, true
    redis.call('HSET', K_LINE_F, 'base', b, 'head', b, 'tail', b, 'hn', 0, 'pad', TREE_PAD)
  elseif b > meta.tail then
    end_moves('tail', b)
    fresh = true
  elseif b < meta.head then
    end_moves('head', b)
    fresh = true
  end
  if redis.call('ZADD', key, score, tid) == 1 then
    meta.n = redis.call('HINCRBY', K_LINE_F, 'n', 1)
    if b == meta.head then meta.hn = redis.call('HINCRBY', K_LINE_F, 'hn', 1) end
    if b ~= meta.head and b ~= meta.tail then
      tree_add(b, 1)
      fresh = redis.call('ZCARD', key) == 1
    end
    if fresh then redis.call('ZADD', K_LINE_I, b, b) end
  end
end

-- The ticket's place (0-based), or nil when it is not in line at that score. A poll's first read of the
-- line: with the base last seen, its figures and the tree fields ahead of the bucket come in one HMGET.
function line_rank(tid, score)
  local guess = BASES[K_LINE]
  if LINE == nil and guess then
    local b = bucket_of(score, guess)
    local path = tree_path(READ_PATHS, b - guess, -1)
    local v = redis.call('HMGET', K_LINE_F, 'n', 'head', 'tail', 'base', 'hn', unpack(path))
    local meta = meta_read(v)  -- the first five, as line_meta() reads them
    if meta.base == guess then  -- else the line started again since: read as below
      local r = redis.call('ZRANK', bucket_key(b), tid)
      if not r then return nil end
      return before_from(meta, b, v, 6) + r
    end
  end
  local b = line_bucket(score)
  local r = redis.call('ZRANK', bucket_key(b), tid)
  if not r then return nil end
  return line_before(b) + r
end

function line_has(tid, score)
  return redis.call('ZSCORE', bucket_key(line_bucket(score)), tid) ~= false
end

-- Take a ticket out of the line; its place, or nil when it was not there. Nobody is told (line_remove).
function line_drop(tid, score)
  local meta = line_meta()
  local b = line_bucket(score)
  local key = bucket_key(b)
  local r = redis.call('ZRANK', key, tid)
  if not r then return nil end
  local rank = line_before(b) + r
  meta.seen = nil
  redis.call('ZREM', key, tid)
  if meta.n <= 1 then  -- nobody left: the tree, its base and ends go
    redis.call('DEL', K_LINE_F, K_LINE_I)
    meta.n, meta.head, meta.tail, meta.base = 0, nil, nil, nil
    return rank
  end
  meta.n = redis.call('HINCRBY', K_LINE_F, 'n', -1)
  if b == meta.head then meta.hn = redis.call('HINCRBY', K_LINE_F, 'hn', -1) end
  local emptied = redis.call('EXISTS', key) == 0
  if emptied then redis.call('ZREM', K_LINE_I, b) end
  if b ~= meta.head and b ~= meta.tail then
    tree_add(b, -1)
  elseif emptied then  -- an end emptied (not both: someone is left)
    if b == meta.head then end_emptied('head', b, 1) else end_emptied('tail', b, -1) end
  end
  return rank
end

-- Take a ticket out of the line (if it is there), noting the place it left.
function line_remove(tid, score)
  local rank = line_drop(tid, score)
  if rank then moved('-', rank) end
end

-- The tickets at places start .. stop (inclusive; -1: the last), and their scores, in line order.
function line_range(start, stop)
  local members, scores = {}, {}
  local n = line_count()
  if stop < 0 then stop = n + stop end
  if stop >= n then stop = n - 1 end
  if start < 0 then start = 0 end
  if start > stop then return members, scores end
  local b, before
  if start == 0 then
    b, before = tonumber(redis.call('ZRANGE', K_LINE_I, 0, 0)[1]), 0
  else
    b, before = bucket_at(start)
  end
  local offset, want, ahead = start - before, stop - start + 1, {}
  while want > 0 and b do
    local got = redis.call('ZRANGE', bucket_key(b), offset, offset + want - 1, 'WITHSCORES')
    for i = 1, #got, 2 do
      members[#members + 1] = got[i]
      scores[#scores + 1] = tonumber(got[i + 1])
    end
    want, offset = want - #got / 2, 0
    if want > 0 then
      if #ahead == 0 then  -- the next buckets, a few at a time
        ahead = redis.call('ZRANGE', K_LINE_I, '(' .. b, '+inf', 'BYSCORE', 'LIMIT', 0, 32)
        for i = 1, math.floor(#ahead / 2) do ahead[i], ahead[#ahead + 1 - i] = ahead[#ahead + 1 - i], ahead[i] end
      end
      b = tonumber(table.remove(ahead))
    end
  end
  return members, scores
end
