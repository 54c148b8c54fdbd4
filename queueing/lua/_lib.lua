-- _lib.lua: shared helpers of every transition script. store/connection.py builds one Redis Functions
-- library of this file and the other modules (LIB_PARTS; each in a scope of its own, using what any of them
-- exports: store/lualib.py), and every script (each script's body becomes a function of its KEYS and
-- ARGV): these definitions run once, when the library is loaded, not on every call.
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
--                           admission, drained by the dashboard's snapshot task (capped at WAITS_KEEP, _transitions.lua)
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
--!exports: K_CFG K_ST K_LINE K_TK K_CLAIMS K_SESSIONS K_DONE K_LEADER K_AWAY K_WAITS K_RESTORE K_LINE_I
--!exports: K_LINE_F LINE WAITING ADMITTED ACTIVE COMPLETED EXPIRED REVOKED R_SEQ R_STATUS R_PRI R_JOINED
--!exports: R_SEEN R_NAME R_EST R_FENCE R_ADMITTED R_DEADLINE R_EXPIRES R_ENDED R_REASON R_LINE_SCORE
--!exports: RATE_TAU_S WAIT_LO_FIRST WAIT_HI_FIRST MOVES LAPSED bind ticket_id vk_of fmt load save has_record
--!exports: forget hash_table moved numbers band_in fmt_all

-- Set by bind() for each call: the KEYS above; the line's bucket index and count tree (line_add); this call's
-- copy of the line's count, tail and base (line_meta).
K_CFG, K_ST, K_LINE, K_TK, K_CLAIMS, K_SESSIONS, K_DONE, K_LEADER, K_AWAY, K_WAITS, K_RESTORE = nil
K_LINE_I, K_LINE_F, LINE = nil

-- The policy fields scripts read, in the order of cfg's packed copy ('packed'): a JSON array (text, like
-- every field of cfg; false for a field not set) that `policy()` reads with one HMGET. Building the
-- policy from HGETALL (42 fields, each a new Lua string, into a table that grows as it goes) cost 12 µs
-- of a status poll's Redis time; from the array, 3.6 µs. Every script that writes cfg (config.lua, epoch.lua,
-- and the library's server_moved and line_upgrade) calls policy_pack() after it writes.
WAITING, ADMITTED, ACTIVE, COMPLETED, EXPIRED, REVOKED = 1, 2, 3, 4, 5, 6

-- Record fields. A waiting ticket stores only the first seven (small: this is per waiting visitor).
R_SEQ, R_STATUS, R_PRI, R_JOINED, R_SEEN, R_NAME, R_EST = 1, 2, 3, 4, 5, 6, 7
R_FENCE, R_ADMITTED, R_DEADLINE, R_EXPIRES, R_ENDED, R_REASON = 8, 9, 10, 11, 12, 13
R_LINE_SCORE = 14  -- the ticket's line score when it is not its sequence number, or it is parked
-- 15 (R_BUCKET, bucket_take): the status limiter's bucket, after `false` in each field before it not set

local SEQ_DIGITS = 10
RATE_TAU_S = 30
-- wait_learn's first range, ln 0.7 .. ln 1.4 (no math library while the library loads).
WAIT_LO_FIRST, WAIT_HI_FIRST = -0.3566749, 0.3364722

-- How this call moved other visitors' places, for the queue_move event: {op, rank, count} with op '-'
-- (count tickets left the line at that rank) or '+' (count tickets were placed at that rank, pushing
-- those at and behind it back). Consecutive moves at one rank merge. See moves_reply().
MOVES = {}
local WHERE = {}  -- where load() found each visitor's record in this call, so save() can move it
LAPSED = {}  -- claims that lapsed unclaimed in this call (expire_slots), each one's age: walk-aways after all

-- Every queue script starts here: its keys, and no moves yet (the library's locals outlive a call). A
-- poll's call leaves the three tables empty, so they are made again only after a call that filled them
-- (three tables a call were 0.3 µs of a poll), and the line's index keys are kept by the line's key.
local LINE_INDEX, LINE_INDEX_KEPT = {}, 0  -- K_LINE -> {K_LINE_I, K_LINE_F}, at most 4,096, then again

function bind(KEYS)
  K_CFG, K_ST, K_LINE, K_TK = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  K_CLAIMS, K_SESSIONS, K_DONE, K_LEADER, K_AWAY = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
  K_WAITS, K_RESTORE = KEYS[10], KEYS[11]
  LINE = nil
  if K_LINE then  -- (not a queue script's KEYS)
    local index = LINE_INDEX[K_LINE]
    if not index then
      if LINE_INDEX_KEPT >= 4096 then LINE_INDEX, LINE_INDEX_KEPT = {}, 0 end
      index, LINE_INDEX_KEPT = {K_LINE .. ':i', K_LINE .. ':f'}, LINE_INDEX_KEPT + 1
      LINE_INDEX[K_LINE] = index
    end
    K_LINE_I, K_LINE_F = index[1], index[2]
  end
  if #MOVES > 0 then MOVES = {} end  -- (a reply may hold the last call's: it is a new table each time)
  if next(WHERE) ~= nil then WHERE = {} end
  if #LAPSED > 0 then LAPSED = {} end
end

local TICKET_ID = '%0' .. SEQ_DIGITS .. 'd.%s'

function ticket_id(seq, vk)
  return string.format(TICKET_ID, seq, vk)
end

function vk_of(tid)
  return string.sub(tid, SEQ_DIGITS + 2)
end

function fmt(x)
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

function load(vk)
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

function save(vk, rec)
  local packed = cmsgpack.pack(rec)
  local key, was = K_TK, WHERE[vk]
  if rec[R_STATUS] == WAITING and #packed <= RECORD_SMALL then  -- its small hash (found there: that key)
    key = (was and was ~= K_TK) and was or record_slot(vk)
  end
  if was and was ~= key then redis.call('HDEL', was, vk) end  -- it moved: one record per visitor, one place
  redis.call('HSET', key, vk, packed)
  WHERE[vk] = key
end

-- Whether the visitor has a record (without reading it).
function has_record(vk)
  return redis.call('HEXISTS', record_slot(vk), vk) == 1 or redis.call('HEXISTS', K_TK, vk) == 1
end

-- Drop a visitor's record, wherever it is.
function forget(vk)
  redis.call('HDEL', record_slot(vk), vk)
  redis.call('HDEL', K_TK, vk)
  WHERE[vk] = nil
end

function hash_table(key)
  local flat = redis.call('HGETALL', key)
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return t
end

function moved(op, rank)
  local last = MOVES[#MOVES]
  if last and last[1] == op and last[2] == rank then
    last[3] = last[3] + 1
  else
    MOVES[#MOVES + 1] = {op, rank, 1}
  end
end

-- The numbers of a counter kept as 'x y z' (thetas, hz, hzl, svh, svx, svr), or nil when it holds other than n.
function numbers(text, n)
  local v = {}
  for x in string.gmatch(text or '', '%S+') do v[#v + 1] = tonumber(x) or 0 end
  if #v ~= n then return nil end
  return v
end

-- The band of x among the bands that start at edges[1 .. nb]: the last to start at or below x (the first,
-- below them all).
function band_in(edges, nb, x)
  local lo, hi = 1, nb  -- (halving: the holds' curve asks some two thousand times a tick, of 28 bands)
  while lo < hi do
    local mid = lo + hi + 1
    mid = (mid - mid % 2) / 2  -- math.floor(mid / 2) of a whole number, without a call
    if x < edges[mid] then hi = mid - 1 else lo = mid end
  end
  return lo
end

-- A counter's numbers as numbers() reads them.
function fmt_all(v)
  local out = {}
  for i = 1, #v do out[#out + 1] = string.format('%.6g', v[i]) end
  return table.concat(out, ' ')
end
