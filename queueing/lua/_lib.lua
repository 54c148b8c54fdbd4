-- _lib.lua: shared helpers of every transition script. store/connection.py builds one Redis Functions
-- library of this file and every script (each script's body becomes a function of its KEYS and ARGV):
-- these definitions run once, when the library is loaded, not on every call.
--
-- Every script gets the same KEYS, all under the queue's hash tag `{slug}` (store.QueueKeys):
--   KEYS[1] cfg       HASH  the queue's policy, mirrored from the database
--   KEYS[2] st        HASH  counters, token bucket, EMAs, sequence numbers, tails, cursors, and the
--                           adaptive outflow's current rate (outflow_effective, outflow_adapted_at)
--   KEYS[3] line            waiting tickets in buckets: ZSETs line:<b>, member = ticket id, score =
--                           placement, and their indexes line:i, line:f (see line_add below)
--   KEYS[4] tk        HASH  ticket records: field = visitor key, value = msgpack array (below)
--   KEYS[5] claims    ZSET  admitted tickets, score = claim deadline (ms)
--   KEYS[6] sessions  ZSET  active tickets, score = session end (ms)
--   KEYS[7] done      ZSET  visitor keys of finished tickets, score = end time (ms), for retention
--   KEYS[8] leader    STRING admission leader token "<instance>:<term>" with a TTL
--   KEYS[9] away      ZSET  waiting tickets found absent at the head, score = last seen (s); their
--                           line score is kept in the record and restored when they are seen again
--   KEYS[10] waits    LIST  "<ticket id> <joined ms> <admitted ms> <estimate at join s, -1 unknown>" per
--                           admission, drained by the dashboard's snapshot task (capped at WAITS_KEEP)
--   KEYS[11] restore  HASH  sequence number -> line score of pre-queue tickets after the shuffle, written
--                           when an epoch starts after lost state (epoch.lua), gone after the window
--
-- Epochs (SPEC 3.6): the policy mirrored from the database carries the queue's epoch; the live state
-- counts only once epoch.lua has started it (`live_epoch` in cfg equals `epoch`). Until then every
-- script answers 'no_config', and Python starts the epoch first: after lost state that is a new epoch,
-- whose sequence numbers begin above every number the database had reserved for the earlier ones.
--
-- A ticket id is "<seq, 10 digits>.<visitor key>": fixed width, so tickets with equal placement scores
-- sort by sequence number (first come, first served), and the record is found from the id alone.
-- The current time always comes from Python (ARGV), never from the Redis server.

local K_CFG, K_ST, K_LINE, K_TK, K_CLAIMS, K_SESSIONS, K_DONE, K_LEADER, K_AWAY, K_WAITS, K_RESTORE  -- bind()
local K_LINE_I, K_LINE_F  -- bind(): the line's bucket index and count tree (line_add below)
local LINE  -- this call's copy of the line's count, tail and base (line_meta below; bind() forgets it)
local WAITS_KEEP = 20000  -- samples not yet drained (the task runs every 10 s): the newest are kept

-- The policy fields scripts read, in the order of cfg's packed copy ('packed'): a JSON array (text, like
-- every field of cfg; false for a field not set) that `policy()` reads with one HMGET. Building the
-- policy from HGETALL (42 fields, each a new Lua string, into a table that grows as it goes) cost 12 µs
-- of a status poll's Redis time; from the array, 3.6 µs. config.lua and epoch.lua, the only scripts that
-- write cfg, call policy_pack() after they write.
local WAITING, ADMITTED, ACTIVE, COMPLETED, EXPIRED, REVOKED = 1, 2, 3, 4, 5, 6

-- Record fields. A waiting ticket stores only the first seven (small: this is per waiting visitor).
local R_SEQ, R_STATUS, R_PRI, R_JOINED, R_SEEN, R_NAME, R_EST = 1, 2, 3, 4, 5, 6, 7
local R_FENCE, R_ADMITTED, R_DEADLINE, R_EXPIRES, R_ENDED, R_REASON = 8, 9, 10, 11, 12, 13
local R_LINE_SCORE = 14  -- the ticket's line score when it is not its sequence number, or it is parked
-- 15 (R_BUCKET, bucket_take): the status limiter's bucket, after `false` in each field before it not set

local SEQ_DIGITS = 10
local RATE_TAU_S = 30
local TICK_S = 1  -- the beat's admission tick (settings: CELERY_BEAT_SCHEDULE)
-- wait_learn's first range, ln 0.7 .. ln 1.4 (no math library while the library loads), and its step.
local WAIT_LO_FIRST, WAIT_HI_FIRST, WAIT_STEP, WAIT_STEP_MIN = -0.3566749, 0.3364722, 0.12, 0.01

-- How this call moved other visitors' places, for the queue_move event: {op, rank, count} with op '-'
-- (count tickets left the line at that rank) or '+' (count tickets were placed at that rank, pushing
-- those at and behind it back). Consecutive moves at one rank merge. See moves_reply().
local MOVES = {}
local WHERE = {}  -- where load() found each visitor's record in this call, so save() can move it
local LAPSED = {}  -- claims that lapsed unclaimed in this call (expire_slots), each one's age: walk-aways after all

-- Every queue script starts here: its keys, and no moves yet (the library's locals outlive a call).
local function bind(KEYS)
  K_CFG, K_ST, K_LINE, K_TK = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  K_CLAIMS, K_SESSIONS, K_DONE, K_LEADER, K_AWAY = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
  K_WAITS, K_RESTORE = KEYS[10], KEYS[11]
  LINE = nil
  if K_LINE then K_LINE_I, K_LINE_F = K_LINE .. ':i', K_LINE .. ':f' end  -- (not a queue script's KEYS)
  MOVES, WHERE, LAPSED = {}, {}, {}
end

local TICKET_ID = '%0' .. SEQ_DIGITS .. 'd.%s'

local function ticket_id(seq, vk)
  return string.format(TICKET_ID, seq, vk)
end

local function vk_of(tid)
  return string.sub(tid, SEQ_DIGITS + 2)
end

local function fmt(x)
  -- Redis truncates Lua numbers to integers in replies and hashes: keep fractions as strings.
  return string.format('%.17g', x)
end

-- Ticket records. A waiting visitor's record (the many) is kept in one of 4,096 small hashes, chosen by
-- the first two characters of its visitor key (`tk:<ab>`; field: the key). Redis keeps a small
-- hash as one listpack: about 45 bytes a record against about 100 in one big hash (bench/RESULTS.md). Every
-- other record (admitted, in session, finished: at most capacity and the retention window's; a waiting
-- one too long for a listpack, e.g. with a long display name) is kept in K_TK itself, as every record was
-- before this split: one written then is found there and moves on its next save.
local RECORD_SMALL = 60  -- bytes; Redis keeps a hash a listpack while its values are within 64 (default)

local function record_slot(vk)
  return K_TK .. ':' .. string.sub(vk, 1, 2)
end

local function load(vk)
  local key = record_slot(vk)
  local raw = redis.call('HGET', key, vk)
  if raw then
    WHERE[vk] = key
  else
    raw = redis.call('HGET', K_TK, vk)
    if not raw then
      WHERE[vk] = nil
      return nil
    end
    WHERE[vk] = K_TK
  end
  return cmsgpack.unpack(raw)
end

local function save(vk, rec)
  local packed = cmsgpack.pack(rec)
  local key = K_TK
  if rec[R_STATUS] == WAITING and #packed <= RECORD_SMALL then key = record_slot(vk) end
  local was = WHERE[vk]
  if was and was ~= key then redis.call('HDEL', was, vk) end  -- it moved: one record per visitor, one place
  redis.call('HSET', key, vk, packed)
  WHERE[vk] = key
end

-- Whether the visitor has a record (without reading it).
local function has_record(vk)
  return redis.call('HEXISTS', record_slot(vk), vk) == 1 or redis.call('HEXISTS', K_TK, vk) == 1
end

-- Drop a visitor's record, wherever it is.
local function forget(vk)
  redis.call('HDEL', record_slot(vk), vk)
  redis.call('HDEL', K_TK, vk)
  WHERE[vk] = nil
end

local function hash_table(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

local function moved(op, rank)
  local last = MOVES[#MOVES]
  if last and last[1] == op and last[2] == rank then
    last[3] = last[3] + 1
  else
    MOVES[#MOVES + 1] = {op, rank, 1}
  end
end

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
local LINE_LAYOUT = 2  -- cfg 'line_layout': 2 = buckets; a policy packed before them is not live (upgrade)

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
local function line_count()
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

local function bucket_key(b)
  return K_LINE .. ':' .. b
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

-- The entries in buckets before b.
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
  local in_tree = meta.n - redis.call('ZCARD', bucket_key(meta.tail))
  if rank >= in_tree then return meta.tail, in_tree end
  local pos, left, step = 0, rank - first, LINE_SIZE
  while step >= 1 do
    local at = pos + step
    if at <= LINE_SIZE then
      local v = tonumber(redis.call('HGET', K_LINE_F, string.format('%d', at))) or 0
      if v <= left then pos, left = at, left - v end
    end
    step = step / 2
  end
  return meta.base + pos, rank - left
end

-- A waiting ticket's score: its sequence number unless its record keeps another.
local function line_score_of(rec)
  return rec[R_LINE_SCORE] or rec[R_SEQ]
end

-- Keep `score` in the record when it is not the sequence number (false holds the places before it:
-- msgpack keeps an array without holes); a record back at its sequence number loses the field.
local function line_score_keep(rec, score)
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

local function line_add(tid, score)
  local meta = line_meta()
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
local function line_rank(tid, score)
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

local function line_has(tid, score)
  return redis.call('ZSCORE', bucket_key(line_bucket(score)), tid) ~= false
end

-- Take a ticket out of the line; its place, or nil when it was not there. Nobody is told (line_remove).
local function line_drop(tid, score)
  local meta = line_meta()
  local b = line_bucket(score)
  local key = bucket_key(b)
  local r = redis.call('ZRANK', key, tid)
  if not r then return nil end
  local rank = line_before(b) + r
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
local function line_remove(tid, score)
  local rank = line_drop(tid, score)
  if rank then moved('-', rank) end
end

-- The tickets at places start .. stop (inclusive; -1: the last), and their scores, in line order.
local function line_range(start, stop)
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

-- A line kept before the buckets (one ZSET at K_LINE itself) moves into them, scores into the records;
-- once, from policy_pack(), whose packed policy then says the layout: until then no script runs on the
-- queue (a policy packed before says no layout, and reads as not live: Python writes it again).
local function line_upgrade()
  if redis.call('TYPE', K_LINE).ok == 'zset' then
    local flat = redis.call('ZRANGE', K_LINE, 0, -1, 'WITHSCORES')
    for i = 1, #flat, 2 do
      local tid, score = flat[i], tonumber(flat[i + 1])
      line_add(tid, score)
      local vk = vk_of(tid)
      local rec = load(vk)
      if rec and rec[R_STATUS] == WAITING and ticket_id(rec[R_SEQ], vk) == tid and line_score_of(rec) ~= score then
        line_score_keep(rec, score)
        save(vk, rec)
      end
    end
    redis.call('DEL', K_LINE)
  end
  redis.call('HSET', K_CFG, 'line_layout', LINE_LAYOUT)
end

-- The counters a poll reads: figures() and estimate_wait() (HGETALL would build every other one too).
local FIGURE_FIELDS = {
  'admitted', 'evseq', 'ema_rate', 'ema_ts', 'ema_service_ms', 'reported_in_use', 'b_tokens', 'b_ts', 'thetas',
  'w_lo', 'w_hi', 'silent', 'pri', 'head_js',
}

local function figure_stats()
  local values = redis.call('HMGET', K_ST, unpack(FIGURE_FIELDS))
  local t = {}
  for i = 1, #FIGURE_FIELDS do t[FIGURE_FIELDS[i]] = values[i] or nil end
  return t
end

local function num(t, field, default)
  local v = tonumber(t[field])
  if v == nil then return default end
  return v
end

local function policy_pack()
  local POLICY_FIELDS = {
    'state', 'live_epoch', 'epoch', 'outflow_per_minute', 'adaptive_outflow', 'capacity', 'capacity_source',
    'burst', 'session_ttl', 'claim_ttl', 'presence_timeout', 'abandon_timeout', 'max_waiting',
    'max_tickets_per_address', 'pow_difficulty', 'target_url', 'seq_max', 'epoch_floor', 'restore_until_ms',
    'restore_hold_until_ms', 'leader_ttl_ms', 'starts_at_ms', 'prequeue_opens_at_ms', 'ends_at_ms',
    'shuffle_pending', 'name', 'mode', 'pf1', 'pf2', 'pf3', 'line_layout', 'server',
  }
  local POLICY_TEXT = {state = true, live_epoch = true, epoch = true, adaptive_outflow = true, capacity_source = true,
    target_url = true, shuffle_pending = true, name = true, mode = true, server = true}
  line_upgrade()
  local values = redis.call('HMGET', K_CFG, unpack(POLICY_FIELDS))
  for i, field in ipairs(POLICY_FIELDS) do
    if values[i] and not POLICY_TEXT[field] then values[i] = tonumber(values[i]) or false end
  end
  redis.call('HSET', K_CFG, 'packed', cjson.encode(values))
end

-- The policy, or nil when the queue's config is not in Redis (never synced, or Redis lost it) or its
-- epoch has not been started there. The outflow is the adapted one while adaptive outflow is on and has
-- adapted (outflow_adapt.lua), else the configured one. `live_epoch` is read from the hash itself too,
-- so a state that lost it (or never had it) is not live whatever the packed copy says; nor is a state
-- found on another server than its epoch's (server_moved).
-- Decoded policies are kept by their packed text (the library's locals outlive a call; Lua compares equal
-- strings by identity): a poll pays one HMGET for its policy, not the decoding too. A script never
-- changes the table it is given; `outflow` is set on every call.
local POLICIES, POLICIES_KEPT = {}, 0  -- at most 256 kept: then they start again

local function policy_decode(packed)
  local v = cjson.decode(packed)
  return {
    live = v[1] and v[2] == v[3] and v[31] == LINE_LAYOUT,
    live_epoch = v[2],
    outflow_configured = v[4] or 60,
    adaptive = v[5] == '1',
    state = v[1],
    capacity = v[6] or 1,
    capacity_source = v[7] or 'counted',
    burst = v[8] or 1,
    session_ttl = v[9] or 900,
    claim_ttl = v[10] or 120,
    presence_timeout = v[11] or 60,
    abandon_timeout = v[12] or 600,
    max_waiting = v[13] or 0,
    max_per_address = v[14] or 0,
    pow_difficulty = v[15] or 0,
    target_url = v[16] or '',
    epoch = tonumber(v[3]) or 1,
    seq_max = v[17] or 0,
    epoch_floor = v[18] or 0,
    restore_until_ms = v[19] or 0,
    restore_hold_ms = v[20] or 0,
    leader_ttl_ms = v[21] or 3000,
    starts_at_ms = v[22] or 0,
    prequeue_opens_ms = v[23] or 0,
    ends_ms = v[24] or 0,
    shuffle_pending = v[25] == '1',
    name = v[26] or '',
    mode = v[27] or 'tracked',  -- 'stateless': these scripts keep nobody (lua/window/ runs the queue)
    fractions = {[1] = v[28] or 0.1, [2] = v[29] or 0.5, [3] = v[30] or 1},
    server = v[32] or '',
  }
end

-- The server a queue's state is on (SPEC 3.6): a Redis Cluster node's id ('c' .. CLUSTER MYID) or a single
-- Redis's run id ('r' .. run_id from INFO). A replica promoted by a failover, or a server started again
-- from its append-only file, is another server. Asked once per server process: the library's locals live
-- as long as its Lua state, which a restart (or a new library) makes again.
local THIS_SERVER = nil

local function server_id()
  if not THIS_SERVER then
    local ok, id = pcall(redis.call, 'CLUSTER', 'MYID')
    THIS_SERVER = ok and ('c' .. id) or ('r' .. string.match(redis.call('INFO', 'server'), 'run_id:(%x+)'))
  end
  return THIS_SERVER
end

-- Whether the queue's state is found on another server than the one its epoch began on (cfg 'server',
-- written by epoch.lua): policy() asks, on every call (a string comparison). Writes the other server had
-- acknowledged may be missing here (a replica is updated asynchronously, an append-only file is written
-- to disk once a second). Then the epoch stops being live (every script answers no_config) and Python
-- begins the next one over what survived (services/recovery.py): numbers resume above everything
-- reserved, and a ticket the lost writes had issued gets its place back when its holder polls, as after
-- a lost state.
local function server_moved(p)
  local known, id = p.server, server_id()
  if known == id then return false end
  if known == '' then  -- an epoch begun before servers were noted: this one is its server
    redis.call('HSET', K_CFG, 'server', id)
  else
    redis.call('HSET', K_CFG, 'server_moved', known)
    redis.call('HDEL', K_CFG, 'live_epoch')
  end
  policy_pack()
  return known ~= ''
end

local function policy()
  local raw = redis.call('HMGET', K_CFG, 'packed', 'live_epoch')
  if not raw[1] or not raw[2] then return nil end
  local p = POLICIES[raw[1]]
  if not p then
    p = policy_decode(raw[1])
    if POLICIES_KEPT >= 256 then POLICIES, POLICIES_KEPT = {}, 0 end
    POLICIES[raw[1]], POLICIES_KEPT = p, POLICIES_KEPT + 1
  end
  if not p.live or p.live_epoch ~= raw[2] then return nil end
  if p.server ~= server_id() and server_moved(p) then return nil end
  p.outflow = p.outflow_configured
  if p.adaptive then
    p.outflow = tonumber(redis.call('HGET', K_ST, 'outflow_effective')) or p.outflow
  end
  return p
end

-- Open, past the scheduled start (before it, visitors wait in a pre-queue and nobody is admitted), the
-- pre-queue's shuffle done (until then its order is not the one admission must follow), not past the end.
local function admitting(p, now)
  return p.state == 'open' and now >= p.starts_at_ms and not p.shuffle_pending
    and (p.ends_ms == 0 or now < p.ends_ms)
end

-- The slots admission may fill. After lost state (epoch.lua) the sessions that were live are unknown but
-- were at most capacity; until the hold ends, each one that came back (restored_sessions) proves one slot
-- free of them, so only that many slots count: new admissions fill only slots restored sessions left.
local function capacity_now(p, st, now)
  if now < p.restore_hold_ms then return math.min(p.capacity, num(st, 'restored_sessions', 0)) end
  return p.capacity
end

local function used_slots(p, st)
  local claims = redis.call('ZCARD', K_CLAIMS)
  if p.capacity_source == 'reported' then
    -- The site counts its own active sessions (absolute, seed 001); visitors admitted but not yet
    -- arrived are ours to count.
    return num(st, 'reported_in_use', 0) + claims
  end
  return claims + redis.call('ZCARD', K_SESSIONS)
end

-- Token bucket refilled by elapsed time (not a fixed number per tick), so however many runners tick,
-- admissions never exceed burst + rate * time. A clock that goes backwards refills nothing.
-- The bucket holds `burst`: after a quiet spell (paused, nobody waiting, every slot taken) at most that
-- many are admitted at once. But a late round is owed its outflow: ticks come once a second to any worker
-- node and only the lease holder admits, so a healthy queue's rounds can be up to a lease and a second
-- apart. A round may spend what accrued since the previous one over at most that long, plus the fraction
-- of a visitor left over (else an outflow that is not whole visitors per round would lose it every round).
local function bucket_tokens(p, st, now)
  local tokens = tonumber(st.b_tokens)
  local ts = tonumber(st.b_ts)
  if tokens == nil or ts == nil then return p.burst, now end
  if now > ts then
    local accrued = (now - ts) * p.outflow / 60000
    local owed = math.min(accrued, p.outflow / 60 * (p.leader_ttl_ms / 1000 + 1))
    local carry = math.min(math.max(tokens, 0), 1)
    tokens = math.min(math.max(p.burst, owed + carry), tokens + accrued)
    ts = now
  end
  return tokens, ts
end

-- Whole tokens available; the epsilon absorbs float drift (ten refills of 0.1 make 0.9999999999999999).
local function whole_tokens(tokens)
  return math.floor(tokens + 1e-6)
end

local function bucket_save(tokens, ts)
  redis.call('HSET', K_ST, 'b_tokens', fmt(tokens), 'b_ts', ts)
end

-- Continuous-time EMA of admissions per second (time constant RATE_TAU_S). It decays only while
-- someone was waiting and the queue was open, so a quiet spell does not read as a slow line.
local function rate_update(st, now, admitted, busy)
  local ema = num(st, 'ema_rate', 0)
  local ts = num(st, 'ema_ts', now)
  if busy and now > ts then ema = ema * math.exp(-(now - ts) / 1000 / RATE_TAU_S) end
  ema = ema + admitted / RATE_TAU_S
  redis.call('HSET', K_ST, 'ema_rate', fmt(ema), 'ema_ts', math.max(ts, now))
end

-- Seed 004: new = old * 0.9 + sample * 0.1.
local function ema_update(field, sample)
  local old = tonumber(redis.call('HGET', K_ST, field))
  local new = sample
  if old ~= nil then new = old * 0.9 + sample * 0.1 end
  redis.call('HSET', K_ST, field, fmt(new))
end

-- What a poll's answer needs about the queue right now (status.lua; store.PollFigures). `used`: the slots in
-- use, when the caller has counted them already (estimate_wait takes them too: one count a poll).
local function poll_figures(p, st, used)
  return {
    p.state, p.capacity, used or used_slots(p, st), line_count(), st.evseq or '0',
    p.presence_timeout, p.target_url, p.epoch, p.claim_ttl, p.starts_at_ms,
    st.w_lo or fmt(WAIT_LO_FIRST), st.w_hi or fmt(WAIT_HI_FIRST),
  }
end

-- What wait estimates, stats and broadcasts need as well (join, admit; store.QueueFigures): the poll's
-- figures, then these.
local function figures(p, st)
  local f = poll_figures(p, st)
  f[13], f[14], f[15], f[16] = fmt(p.outflow), st.ema_rate or '0', st.ema_ts or '0', st.ema_service_ms or '0'
  f[17], f[18], f[19] = num(st, 'admitted', 0), redis.call('ZCARD', K_AWAY), p.name
  return f
end

-- Priority joiners placed ahead (join.lua: a level's joiner goes in at its placement fraction from the
-- back): st.pri holds each level's recent arrival rate (an EMA, a second's worth per RATE_TAU_S) as
-- 'r1 r2 r3 ts'; a queue nobody joined with a code has none and pays nothing for this.
-- Where a visitor of level `pri` goes in a line of `n` (seed 003; join.lua's header tells the rule): the
-- score `seq` for level 0, or when the level's placement fraction is 0 or the line is empty; else ahead of
-- the last `fraction` of the line, but never ahead of an earlier joiner of its level or higher (tL in st)
-- or of any ticket of an earlier epoch (epoch_floor). join.lua places joiners; promote.lua, code holders.
local function priority_place(p, st, pri, n, seq)
  local fraction = p.fractions[pri] or 0
  if pri <= 0 or fraction <= 0 or n <= 0 then return seq end
  local tail = nil
  if p.epoch_floor > 0 then tail = p.epoch_floor end
  for level = pri, 3 do
    local t = tonumber(st['t' .. level])
    if t ~= nil and (tail == nil or t > tail) then tail = t end
  end
  local index = math.floor(n * (1 - fraction))
  if index >= n then return seq end
  local _, around = line_range(math.max(0, index - 1), index)  -- the places before and at index
  local at_score = around[#around]
  if tail ~= nil and at_score <= tail then
    return tail  -- right behind the last earlier joiner of this level or higher
  end
  local low = at_score - 1
  if index > 0 then low = around[1] end
  if tail ~= nil and tail > low then low = tail end
  local mid = (low + at_score) / 2
  if mid > low and mid < at_score then return mid end
  if low < at_score then return low end  -- ties sort by sequence: right behind the predecessor
  return at_score  -- no room at all: one place further back
end

local function priority_rates(st, now)
  if not st.pri then return nil end
  local r1, r2, r3, ts = string.match(st.pri, '^(%S+) (%S+) (%S+) (%S+)$')
  local decay = math.exp(-math.max(0, now - (tonumber(ts) or now)) / 1000 / RATE_TAU_S)
  return {(tonumber(r1) or 0) * decay, (tonumber(r2) or 0) * decay, (tonumber(r3) or 0) * decay}
end

local function priority_note(st, level, now)
  local r = priority_rates(st, now) or {0, 0, 0}
  r[level] = r[level] + 1 / RATE_TAU_S
  st.pri = string.format('%.6g %.6g %.6g %d', r[1], r[2], r[3], now)
  redis.call('HSET', K_ST, 'pri', st.pri)
end

-- How many priority joiners a second are expected to be placed ahead of a visitor of priority `level`
-- with `ahead` in front, averaged over its wait: a joiner of a higher level goes ahead while the visitor
-- is further back than that level's place, (1 - fraction) of the line; as the visitor moves up linearly
-- from `ahead` to the head, that is the first 1 - (1 - fraction) * line / ahead of its wait. (One of its
-- own level or lower goes behind it: behind the last earlier joiner of its level or higher.)
local function priority_ahead_rate(p, st, ahead, level, now)
  local rates = priority_rates(st, now)
  if rates == nil or ahead <= 0 then return 0 end
  local line = line_count()
  local rate = 0
  for higher = level + 1, 3 do
    if rates[higher] > 0 then
      local share = 1 - (1 - (p.fractions[higher] or 0)) * line / ahead
      if share > 0 then rate = rate + rates[higher] * math.min(1, share) end
    end
  end
  return rate
end

-- Walking away depends on how long one has waited: in a sale where everyone who gives up does so in
-- their first twenty seconds, those who have waited a minute stay. The hazard is learnt per band of time
-- waited (HAZARD_BANDS, seconds; hazard_save), and st.thetas holds each band's rate. hazard_curve makes
-- it the cumulative hazard H(a), walk-aways expected of one who has waited a seconds: of those who have
-- waited a, e^-(H(a + s) - H(a)) are still there s seconds later. (Eleven narrower bands, 0-5-10-20-30-45-
-- 60-90-120-180-300 s, were tried in the simulator: no better, bench/RESULTS.md.)
local HAZARD_BANDS = {0, 10, 30, 90, 300}
local HAZARD_NB = #HAZARD_BANDS

local function hazard_curve(st)
  local rates = {}
  for x in string.gmatch(st.thetas or '', '%S+') do rates[#rates + 1] = tonumber(x) or 0 end
  if #rates ~= HAZARD_NB then return nil end
  local at, any = {0}, false  -- at[b]: H at the start of band b
  for b = 1, HAZARD_NB do
    if rates[b] > 0 then any = true end
    if b < HAZARD_NB then at[b + 1] = at[b] + rates[b] * (HAZARD_BANDS[b + 1] - HAZARD_BANDS[b]) end
  end
  if not any then return nil end
  return function(a)
    local b = HAZARD_NB
    while b > 1 and a < HAZARD_BANDS[b] do b = b - 1 end
    return at[b] + rates[b] * (a - HAZARD_BANDS[b])
  end
end

-- How long ago one who looks present is known to have been there: walking away shows only once the
-- presence timeout has passed since the last sighting, and one who stays was last seen on average half a
-- poll's gap ago (at most the sighting ceiling, selectors.tickets.sighting_ceiling, apart).
local function presence_lag(p)
  local ceiling = math.max(2, math.min(p.presence_timeout / 3, p.claim_ttl / 2))
  return math.max(0, p.presence_timeout - ceiling / 2)
end

-- Of those ahead, the head reaches each in turn over the next t seconds: the one at a share u of the way
-- from the head to this visitor is reached at u t, and has waited (linearly from the head's wait to this
-- visitor's own) A - (A - own) u, and was last known to be there presence_lag(p) ago. stay(t) is the
-- share still there when reached, e^-(H(age + u t) - H(age - lag)) (4-point Gauss-Legendre over u: H has
-- few kinks, and the nodes cost four H a step of the bisection).
local GL_U = {0.0694318442, 0.3300094782, 0.6699905218, 0.9305681558}
local GL_W = {0.1739274226, 0.3260725774, 0.3260725774, 0.1739274226}

local function hazard_stay(p, st, now, own_s)
  local H = hazard_curve(st)
  if H == nil then return nil end
  local head_s = math.max(own_s, (now - (tonumber(st.head_js) or now)) / 1000)
  local ages, base = {}, {}
  local lag = presence_lag(p)
  for i = 1, 4 do
    ages[i] = head_s - (head_s - own_s) * GL_U[i]
    base[i] = H(math.max(0, ages[i] - lag))
  end
  return function(t)
    local stay = 0
    for i = 1, 4 do stay = stay + GL_W[i] * math.exp(base[i] - H(ages[i] + t * GL_U[i])) end
    return stay
  end
end

-- Estimated seconds until a visitor with `ahead` tickets in front (of priority `level`, waiting for
-- own_s seconds so far) is admitted, or -1 when unknown (paused or closed). The line drains from its head,
-- where each visitor reached is admitted or, gone (stopped polling: parked; or left), skipped at no cost.
-- Of the `ahead`, the share found silent in the line already (st.silent) are gone; each of the others may
-- still walk away while it waits, at the rate of its time waited (hazard_stay), so of those the head
-- reaches over the next t seconds stay(t) are still there: n admissions, this visitor's included. By a
-- time t from now at most B + r_out * t are admitted (the bucket's tokens B, the outflow in force r_out
-- a second) and at most F + r_cap * t (the free slots F, and slots freed at capacity / the mean time a
-- slot is held, once that is known). Priority joiners placed ahead meanwhile add to n, in proportion to
-- t (priority_ahead_rate). The estimate is the t at which both bounds allow n(t) (bisection; n is never
-- taken as more than twice the walk-free count). Until a slot has been given back once, how long
-- sessions last is not known, and neither is the wait of a visitor who needs more slots than are free:
-- -1, unknown (the queue keeps its record across sales). A site that reports its own count: the
-- observed admission rate stands in for r_cap. A scheduled start adds the time until it.
-- Near the head the slots that come back first are looked at one by one (issue 20: a line stalled on an
-- admission nobody claimed was told "less than a minute" at every poll until the claim lapsed, two minutes
-- on). An admission unclaimed for CLAIM_LATE_S is taken to lapse at its deadline (its visitor would have
-- claimed by now: the page hands over at once); the other slots come back at the site's pace, r_cap for
-- all the slots less the late ones. Returns k -> seconds until k slots have come back (no late admission:
-- nil, the pace alone). Only for a visitor within HEAD_SLOTS of a slot: one ranged read of the claims.
local CLAIM_LATE_S, HEAD_SLOTS = 10, 32
local function slots_back(p, now, r_cap)
  local cutoff = now + (p.claim_ttl - CLAIM_LATE_S) * 1000
  local rows = redis.call('ZRANGEBYSCORE', K_CLAIMS, '-inf', cutoff, 'WITHSCORES', 'LIMIT', 0, HEAD_SLOTS)
  if #rows == 0 then return nil end
  local late = {}
  for i = 2, #rows, 2 do late[#late + 1] = math.max(0, (tonumber(rows[i]) - now) / 1000) end
  local late_n = #late
  if late_n == HEAD_SLOTS then late_n = redis.call('ZCOUNT', K_CLAIMS, '-inf', cutoff) end
  local r_other = r_cap * math.max(0, p.capacity - late_n) / p.capacity
  return function(k)  -- back by t: r_other t, and each late admission at its deadline
    for i, d in ipairs(late) do
      if r_other > 0 and r_other * d + (i - 1) >= k then return (k - (i - 1)) / r_other end
      if r_other * d + i >= k then return d end
    end
    if r_other > 0 then return (k - #late) / r_other end
    return late[#late] + (k - #late) / r_cap  -- every slot was a late admission: then the site's pace
  end
end

local function estimate_wait(p, st, ahead, now, used, level, own_s)
  if p.state ~= 'open' then return -1 end
  local until_start = math.max(0, p.starts_at_ms - now) / 1000
  local r_out = p.outflow / 60
  if r_out <= 0 then return -1 end
  local present = math.max(0, ahead) * (1 - math.min(0.9, num(st, 'silent', 0)))
  local tokens = math.max(0, whole_tokens((bucket_tokens(p, st, math.max(now, p.starts_at_ms)))))
  local free = math.max(0, capacity_now(p, st, now) - (used or used_slots(p, st)))
  local r_cap = nil
  local service_ms = num(st, 'ema_service_ms', 0)
  if service_ms > 0 then
    r_cap = p.capacity / (service_ms / 1000)
  elseif p.capacity_source == 'reported' and num(st, 'ema_ts', 0) > 0 then
    -- the site counts its own sessions, so their length is never seen here: the observed pace
    local age_s = math.max(0, now - num(st, 'ema_ts', 0)) / 1000
    r_cap = num(st, 'ema_rate', 0) * math.exp(-age_s / RATE_TAU_S)
  end
  local back = nil
  if r_cap ~= nil and r_cap > 0 and present + 1 - free <= HEAD_SLOTS then back = slots_back(p, now, r_cap) end
  local function drained(n)  -- seconds until n admissions are allowed; nil: unknown
    local t = (n - tokens) / r_out
    if n > free then  -- this visitor needs a slot that is not free yet: when do slots come back?
      if r_cap == nil or r_cap <= 0 then return nil end  -- no slot has come back yet: nobody can know
      t = math.max(t, back and back(n - free) or (n - free) / r_cap)
    end
    return math.max(0, t)
  end
  local t = drained(present + 1)
  if t == nil then return -1 end
  local stay = present > 0 and hazard_stay(p, st, now, math.max(0, own_s or 0)) or nil
  local cutting = priority_ahead_rate(p, st, ahead, level or 0, now)
  if stay ~= nil or cutting > 0 then
    local cap = 2 * (present + 1)
    if r_cap == nil or r_cap <= 0 then cap = math.min(cap, free) end  -- known only within the free slots
    local function admissions(t)  -- n(t): those ahead still there when reached, cutters, and itself
      return math.min(cap, (present + cutting * t) * (stay and stay(t) or 1) + 1)
    end
    local lo, hi = 0, drained(cap)
    for _ = 1, 14 do  -- drained(n(t)) - t falls from >= 0 at 0 to <= 0 at hi
      t = (lo + hi) / 2
      if drained(admissions(t)) > t then lo = t else hi = t end
    end
    t = (lo + hi) / 2
  end
  return math.ceil(until_start + t + TICK_S / 2)  -- admissions come with the next tick
end

-- How far waits fall from what was told: w_lo and w_hi follow the 10th and 90th percentiles of
-- ln(wait had / wait told at the join) over the queue's admissions (a stochastic quantile estimate: one
-- step per admission, bounded memory). A step is WAIT_STEP of the range's width, so a queue whose waits
-- come out close to what was told gets a range that close, not one a fixed step wide (at 0.08 a step, a
-- steady sale's range held 95 % of its waits, not 80 %). The API's estimated_wait_range is the estimate
-- times e^w_lo .. e^w_hi. Until a queue has a record, a wide range: 0.7 to 1.4 times.
local function wait_learn(rec, now)
  local told = tonumber(rec[R_EST]) or -1
  local had_s = (now - rec[R_JOINED]) / 1000
  if told < 1 or had_s < 1 then return end
  local b = redis.call('HMGET', K_ST, 'w_lo', 'w_hi', 'opened_ms')
  if rec[R_JOINED] < (tonumber(b[3]) or 0) then return end  -- it waited through a pause: no lesson there
  local x = math.log(had_s / told)
  local lo, hi = tonumber(b[1]) or WAIT_LO_FIRST, tonumber(b[2]) or WAIT_HI_FIRST
  local step = math.max(WAIT_STEP_MIN, WAIT_STEP * (hi - lo))
  if x < lo then lo = lo - step * 0.9 else lo = lo + step * 0.1 end
  if x > hi then hi = hi + step * 0.9 else hi = hi - step * 0.1 end
  redis.call('HSET', K_ST, 'w_lo', fmt(math.max(-3, math.min(lo, 0))), 'w_hi', fmt(math.min(3, math.max(hi, 0))))
end

-- When admission last began again after a spell without it (paused, closed, before a start): waits that
-- began before then were not the estimate's to foresee (wait_learn). The admission script notes it.
local function opened_note(p, st, now)
  if admitting(p, now) then
    if st.adm_off then redis.call('HSET', K_ST, 'opened_ms', now) redis.call('HDEL', K_ST, 'adm_off') end
  elseif not st.adm_off then
    redis.call('HSET', K_ST, 'adm_off', '1')
  end
end

-- The estimate a waiting visitor is told: before a scheduled start's draw its place is not known yet, so
-- the estimate is for the middle of the pre-queue as it will be at the start (the API gives the range over
-- the draw): it grows until then at the pace it has grown since it opened (over at least PREQUEUE_PACE_S,
-- so that its first seconds do not make a crowd of a handful). Seen in the simulator: counting only those
-- in it so far, the first to join were told the wait of the middle of seven, and had the wait of a place
-- among sixty.
local PREQUEUE_PACE_S = 10
local function estimate_told(p, st, level, rank, now, used, joined)
  local own_s = (now - (joined or now)) / 1000
  if p.shuffle_pending and now < p.starts_at_ms then
    local n = line_count()
    if p.prequeue_opens_ms > 0 and now > p.prequeue_opens_ms then
      local open_s = math.max(PREQUEUE_PACE_S, (now - p.prequeue_opens_ms) / 1000)
      n = n + n / open_s * (p.starts_at_ms - now) / 1000
    end
    return estimate_wait(p, st, (n - 1) / 2, now, used, level, own_s)
  end
  return estimate_wait(p, st, rank, now, used, level, own_s)
end

-- Walking away as a rate (Ibrahim & Whitt's delay predictors with abandonment), per band of time waited:
-- from the departures at the head, the maximum-likelihood rate of a hazard constant within each band.
-- One skipped there walked away after (last seen - joined) seconds of waiting; one admitted waited
-- (now - joined) and did not; one admitted who then let its claim lapse had walked away too (counted when
-- it lapses: hazard_lapsed). Each departure adds its seconds to the bands its wait crossed, and its walk to
-- the band it walked in. Sums over the last ~HAZARD_SPAN departures (each one's weight falls by
-- 1/HAZARD_SPAN with every later one), from a prior of HAZARD_PRIOR departures of HAZARD_PRIOR_S seconds
-- each in which nobody walked away: a new queue learns from its first departures without one walk-away
-- making everyone a walk-away, and a queue keeps its record across sales. A band with few seconds in it
-- leans on the band before it (the first, on the rate over all bands, theta): (walks + K rate before) /
-- (seconds + K), K = HAZARD_SHRINK_S, so waits longer than any seen yet go on as the longest seen did.
-- 'hz' holds the sums ('walks seconds' per band); 'thetas', the bands' rates, is what polls read; 'theta'
-- is the overall rate. The head learns late: it meets a burst's walk-aways only once it reaches them (in
-- the simulator's forty-percent sale, 36 s in, the rates were a tenth of the walk-aways' own). So the tick's
-- look at the line learns too (silent_look, 'hzl': the same sums, fading by LINE_KEPT a look), and the
-- rates are taken from both.
local HAZARD_SPAN, HAZARD_PRIOR, HAZARD_PRIOR_S, HAZARD_SHRINK_S = 50, 5, 20, 30

local function band_seconds(b, waited)  -- of a wait of `waited` seconds, those spent in band b
  return math.max(0, math.min(waited, HAZARD_BANDS[b + 1] or waited) - HAZARD_BANDS[b])
end

local function band_of(waited)
  local b = HAZARD_NB
  while b > 1 and waited < HAZARD_BANDS[b] do b = b - 1 end
  return b
end

local function hazard_load(st)
  local h = {}
  for x in string.gmatch(st.hz or '', '%S+') do h[#h + 1] = tonumber(x) or 0 end
  if #h == 2 * HAZARD_NB then return h end
  h = {}  -- nothing learnt yet (or the sums of one rate for every wait, before the bands): the prior
  for b = 1, HAZARD_NB do h[2 * b - 1], h[2 * b] = 0, HAZARD_PRIOR * band_seconds(b, HAZARD_PRIOR_S) end
  return h
end

local function hazard_stored()  -- hazard_load, for a script that has not read the queue's counters
  return hazard_load({hz = redis.call('HGET', K_ST, 'hz') or nil})
end

-- Adds one wait of `seconds` to sums in hz's form: its seconds to the bands it crossed, its walk (walked 1) to
-- the band it walked in.
local function sums_note(hl, walked, seconds)
  seconds = math.max(0, seconds)
  for b = 1, HAZARD_NB do hl[2 * b] = hl[2 * b] + band_seconds(b, seconds) end
  if walked > 0 then
    local b = band_of(seconds)
    hl[2 * b - 1] = hl[2 * b - 1] + walked
  end
end

local function hazard_note(h, walked, seconds)
  local kept = 1 - 1 / HAZARD_SPAN
  for i = 1, 2 * HAZARD_NB do h[i] = h[i] * kept end
  sums_note(h, walked, seconds)
  return h
end

-- The line's sums (silent_look), in the same form as the head's: {} when there are none.
local function hazard_line(hzl)
  local hl = {}
  for x in string.gmatch(hzl or '', '%S+') do hl[#hl + 1] = tonumber(x) or 0 end
  if #hl ~= 2 * HAZARD_NB then return {} end
  return hl
end

-- Saves the head's sums h, and the bands' rates from them and the line's sums hl (read when not given).
local function hazard_save(h, hl)
  hl = hl or hazard_line(redis.call('HGET', K_ST, 'hzl') or nil)
  local all = {}
  for i = 1, 2 * HAZARD_NB do all[i] = h[i] + (hl[i] or 0) end
  local walks, secs = 0, 0
  for b = 1, HAZARD_NB do walks, secs = walks + all[2 * b - 1], secs + all[2 * b] end
  local theta = walks / math.max(1, secs)
  local sums, rates, before = {}, {}, theta
  for b = 1, HAZARD_NB do
    sums[2 * b - 1], sums[2 * b] = string.format('%.6g', h[2 * b - 1]), string.format('%.6g', h[2 * b])
    before = (all[2 * b - 1] + HAZARD_SHRINK_S * before) / (all[2 * b] + HAZARD_SHRINK_S)
    rates[b] = string.format('%.4g', before)
  end
  redis.call('HSET', K_ST, 'hz', table.concat(sums, ' '), 'thetas', table.concat(rates, ' '), 'theta', fmt(theta))
end

-- How long a departure at the head had waited (seconds), and for one skipped, until it was last seen.
local function waited_s(rec, now, walked)
  if walked then return rec[R_SEEN] - rec[R_JOINED] / 1000 end
  return (now - rec[R_JOINED]) / 1000
end

local function hazard_lapsed(ages)  -- walks only: their seconds were counted when they were admitted
  local h = hazard_stored()
  for _, waited in ipairs(ages) do
    local b = band_of(math.max(0, waited))
    h[2 * b - 1] = h[2 * b - 1] + 1
  end
  hazard_save(h)
end

-- Who has gone silent in the line already, before the head reaches them: the share of SILENT_SAMPLES
-- tickets, spread over the line, not seen within the presence timeout (the admission tick looks, once a
-- second; st.silent, lightly smoothed). Walking away shows here a presence timeout after it happens, long
-- before the head gets there: estimate_wait counts those as gone, and the others at the rate of their
-- time waited. The look notes when the head joined too (head_js: hazard_stay's oldest wait ahead), and
-- adds what each ticket it looks at says of walking away to the line's sums ('hzl'): a silent one walked
-- away after its wait to its last sighting; any other stayed at least until a presence timeout ago (a walk
-- since would not show yet). The sums fade by LINE_KEPT a look, and are dropped once faded below
-- LINE_FADED (the line has been empty a while): they speak for the line as it is now.
local SILENT_SAMPLES = 24
local LINE_KEPT, LINE_FADED = 0.9, 0.01
local function silent_look(p, st, now)
  local n = line_count()
  local seen, silent, head_js = 0, 0, now
  local hl, any = hazard_line(st.hzl), false
  for i = 1, #hl do hl[i] = hl[i] * LINE_KEPT end
  if #hl == 0 then for i = 1, 2 * HAZARD_NB do hl[i] = 0 end end
  if n > 0 then
    local head = line_range(0, 0)
    local first = head[1] and load(vk_of(head[1]))
    if first then head_js = first[R_JOINED] end
    local present_since = math.floor(now / 1000) - p.presence_timeout
    local shift = (now % 997) / 997
    local count = math.min(n, SILENT_SAMPLES)
    for i = 0, count - 1 do
      local rank = math.floor((i + shift) * n / count)
      local batch = line_range(rank, rank)
      local rec = batch[1] and load(vk_of(batch[1]))
      if rec and rec[R_STATUS] == WAITING then
        seen = seen + 1
        local joined_s = rec[R_JOINED] / 1000
        if rec[R_SEEN] < present_since then  -- walked away after its wait to its last sighting
          silent = silent + 1
          sums_note(hl, 1, rec[R_SEEN] - joined_s)
        else  -- stayed at least until the presence timeout ago: a walk since would not show yet
          sums_note(hl, 0, present_since - joined_s)
        end
      end
    end
  end
  for i = 1, #hl do any = any or hl[i] > LINE_FADED end
  local share = seen > 0 and silent / seen or 0
  local old = tonumber(st.silent) or share
  redis.call('HSET', K_ST, 'silent', fmt(old * 0.5 + share * 0.5), 'head_js', head_js)
  if any then
    local sums = {}
    for i = 1, #hl do sums[i] = string.format('%.6g', hl[i]) end
    redis.call('HSET', K_ST, 'hzl', table.concat(sums, ' '))
  else
    hl = {}
    redis.call('HDEL', K_ST, 'hzl')
  end
  hazard_save(hazard_stored(), hl)
end

-- {event sequence, moves}, or 0 when nobody moved: the sequence grows by one for every call that moved anyone, so a client
-- that sees a gap knows it missed an event and polls.
local function moves_reply()
  if #MOVES == 0 then return 0 end  -- store.Moves reads 0 as nobody moved
  return {redis.call('HINCRBY', K_ST, 'evseq', 1), MOVES}
end

-- WAITING -> ADMITTED. The caller has removed the ticket from the line and checked the policy.
local function admit(p, tid, rec, now)
  local vk = vk_of(tid)
  local fence = redis.call('HINCRBY', K_ST, 'fence', 1)
  local deadline = now + p.claim_ttl * 1000
  local expires = now + p.session_ttl * 1000
  rec[R_STATUS] = ADMITTED
  rec[R_FENCE] = fence
  rec[R_ADMITTED] = now
  rec[R_DEADLINE] = deadline
  rec[R_EXPIRES] = expires
  rec[R_ENDED] = 0
  rec[R_REASON] = ''
  line_score_keep(rec, rec[R_SEQ])  -- out of line: no place to keep
  save(vk, rec)
  redis.call('ZADD', K_CLAIMS, deadline, tid)
  redis.call('HINCRBY', K_ST, 'admitted', 1)
  ema_update('ema_wait_ms', math.max(0, now - rec[R_JOINED]))
  wait_learn(rec, now)
  redis.call('RPUSH', K_WAITS, tid .. ' ' .. fmt(rec[R_JOINED]) .. ' ' .. fmt(now) .. ' ' .. fmt(rec[R_EST] or -1))
  redis.call('LTRIM', K_WAITS, -WAITS_KEEP, -1)
  return {tid, fence, expires, rec[R_JOINED], rec[R_EST]}
end

-- How long a slot is held (ema_service_ms: sessions and unclaimed admissions alike), the mean of the
-- last ~SERVICE_SPAN slots given back (the mean of all of them until there are that many). Slots come
-- back shortest first after a burst, then the long ones: an average weighing the last ten (as it was)
-- followed that order, low and then high (tests/test_estimates.py: 16.2 s for sessions of 14.5 s).
local SERVICE_SPAN = 50
local function service_note(sample)
  local b = redis.call('HMGET', K_ST, 'ema_service_ms', 'svc_n')
  local n = (tonumber(b[2]) or (b[1] and 10 or 0)) + 1  -- a queue from before the count: as if ten
  local old = tonumber(b[1]) or sample
  local new = old + (sample - old) / math.min(n, SERVICE_SPAN)
  redis.call('HSET', K_ST, 'ema_service_ms', fmt(new), 'svc_n', math.min(n, SERVICE_SPAN))
end

-- Any live ticket -> a final state. Frees its slot if it held one; keeps the record for a while
-- (the `done` set) so a late poll hears `completed` or `expired` rather than nothing.
local function finish(tid, rec, status, reason, now)
  local vk = vk_of(tid)
  local held = rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE
  if rec[R_STATUS] == WAITING then
    line_remove(tid, line_score_of(rec))
    redis.call('ZREM', K_AWAY, tid)
  elseif held then
    redis.call('ZREM', K_CLAIMS, tid)
    redis.call('ZREM', K_SESSIONS, tid)
    service_note(math.max(0, now - rec[R_ADMITTED]))
  end
  while #rec < R_REASON do rec[#rec + 1] = 0 end
  for i = #rec, R_LINE_SCORE, -1 do rec[i] = nil end  -- the parked place, the status limiter's bucket
  rec[R_STATUS] = status
  rec[R_ENDED] = now
  rec[R_REASON] = reason
  save(vk, rec)
  redis.call('ZADD', K_DONE, now, vk)
  redis.call('HINCRBY', K_ST, reason, 1)
  return held
end

-- A waiting visitor found absent at the head leaves the line for `away`, so admission does not look at
-- it again; its line score goes into the record. Same memory: one entry moves from one set to another.
local function park(tid, rec)
  local score = line_score_of(rec)
  while #rec < R_REASON do rec[#rec + 1] = 0 end
  rec[R_LINE_SCORE] = score
  save(vk_of(tid), rec)
  line_remove(tid, score)
  redis.call('ZADD', K_AWAY, rec[R_SEEN], tid)
end

-- The rank of a waiting ticket; a parked one that shows up again first gets its place back.
local function waiting_rank(tid, rec)
  local score = line_score_of(rec)
  local rank = line_rank(tid, score)
  if rank or not redis.call('ZSCORE', K_AWAY, tid) then return rank end
  redis.call('ZREM', K_AWAY, tid)
  line_add(tid, score)
  for i = #rec, R_EST + 1, -1 do rec[i] = nil end  -- back to the small waiting record
  line_score_keep(rec, score)
  save(vk_of(tid), rec)
  rank = line_rank(tid, score)
  moved('+', rank)
  return rank
end

-- The status limiter's token bucket (lua/limits/token_bucket.lua's rule, status.lua) kept in the ticket's
-- record as one number: R_BUCKET, the time (ms after the visitor joined) at which the bucket was empty; at
-- `at` it holds (at - that time) x rate tokens, at most its capacity. A request takes `cost` tokens or is
-- refused, and a refusal changes nothing. Returns nil when it was let through, else a limiter's refusal:
-- {0, retry after (ms), tokens left, 0}.
local R_BUCKET = 15
local function bucket_take(rec, at, capacity, per_ms, cost)
  local tokens = capacity
  if rec[R_BUCKET] then tokens = math.min(capacity, (at - rec[R_JOINED] - rec[R_BUCKET]) * per_ms) end
  -- The epsilon absorbs float drift: 0.01 a second is 1.0000000000000001e-05 a ms.
  if tokens + 1e-9 < cost then return {0, math.ceil((cost - tokens) / per_ms), fmt(tokens), 0} end
  tokens = math.max(0, tokens - cost)
  while #rec < R_BUCKET - 1 do rec[#rec + 1] = false end  -- no holes: msgpack keeps it an array
  rec[R_BUCKET] = at - rec[R_JOINED] - tokens / per_ms  -- whole ms mostly (8 bytes at most when not)
  return nil
end

-- Why a live ticket should already be over at `now` (absent too long, unclaimed, session ended), or nil.
local function overdue(p, rec, now)
  local status = rec[R_STATUS]
  if status == WAITING and now - rec[R_SEEN] * 1000 > p.abandon_timeout * 1000 then
    return 'abandoned'
  elseif status == ADMITTED and now >= rec[R_DEADLINE] then
    return 'expired_claim'
  elseif status == ACTIVE and now >= rec[R_EXPIRES] then
    return 'expired_session'
  end
  return nil
end

-- Finish an overdue ticket; returns 1 when that freed a slot (the caller then runs admission).
local function finish_overdue(tid, rec, reason, now)
  if finish(tid, rec, EXPIRED, reason, now) then return 1 end
  return 0
end

-- The ticket part of a join or status reply.
local function ticket_reply(tid, rec, rank, est, freed)
  return {tid, rec[R_SEQ], rec[R_STATUS], rank, rec[R_FENCE] or 0, rec[R_EXPIRES] or 0, est,
          rec[R_REASON] or '', freed, rec[R_PRI]}
end

-- A signed ticket or access token of an earlier epoch whose record the lost state took with it, shown
-- while the window after the loss lasts (SPEC 3.6): its holder gets its place or session back.
-- Not one the database noted as finished before the loss (finished.lua; epoch.lua marks them 'gone').
local function restorable(p, vk, seq, ticket_epoch, now)
  return ticket_epoch < p.epoch and now < p.restore_until_ms and not has_record(vk)
    and redis.call('HGET', K_RESTORE, seq) ~= 'gone'
end

-- Find the session an access token speaks of. Returns rec, reason: reason is nil when the session
-- is live; else 'expired' | 'superseded' | 'revoked' | 'completed'. A session found overdue is
-- finished here; the third value is then 1 when that freed a slot.
local function session_lookup(p, vk, seq, fence, now)
  local rec = load(vk)
  if not rec then return nil, 'expired', 0 end
  local live = rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE
  if rec[R_SEQ] ~= seq or rec[R_FENCE] ~= fence then
    -- The visitor's current ticket is another one: superseded if that one holds a session.
    if live and rec[R_SEQ] ~= seq then return rec, 'superseded', 0 end
    if rec[R_SEQ] == seq then return rec, 'superseded', 0 end
    return rec, 'expired', 0
  end
  if rec[R_STATUS] == REVOKED then return rec, 'revoked', 0 end
  if rec[R_STATUS] == COMPLETED then return rec, 'completed', 0 end
  if not live then return rec, 'expired', 0 end
  local reason = overdue(p, rec, now)
  if reason then return rec, 'expired', finish_overdue(ticket_id(seq, vk), rec, reason, now) end
  return rec, nil, 0
end

-- Expire admitted tickets past their claim deadline and sessions past their end, at most `limit`.
local function expire_slots(now, limit)
  local expired = {}
  for _, spec in ipairs({{K_CLAIMS, 'expired_claim'}, {K_SESSIONS, 'expired_session'}}) do
    local due = redis.call('ZRANGEBYSCORE', spec[1], '-inf', now, 'LIMIT', 0, limit)
    for _, tid in ipairs(due) do
      local rec = load(vk_of(tid))
      if rec and (rec[R_STATUS] == ADMITTED or rec[R_STATUS] == ACTIVE) and ticket_id(rec[R_SEQ], vk_of(tid)) == tid then
        finish(tid, rec, EXPIRED, spec[2], now)
        if spec[1] == K_CLAIMS then  -- it walked away after it was last seen in the line, or at its admission
          local waited = (math.min(rec[R_SEEN] * 1000, rec[R_ADMITTED] or now) - rec[R_JOINED]) / 1000
          LAPSED[#LAPSED + 1] = waited
        end
      else
        redis.call('ZREM', spec[1], tid)  -- a stray entry: its record moved on
      end
      expired[#expired + 1] = tid
    end
  end
  return expired
end
