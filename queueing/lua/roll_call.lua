-- roll_call.lua: a websocket server answers for its sockets of one queue together (consumers.py), a few
-- hundred at a time: each socket's lease is renewed (as viewer_open.lua renews it), and each waiting
-- visitor with a socket is seen (presence, as a status poll sees it) without a poll of its own.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] now (ms)   ARGV[2] lease length (ms)
-- then four per socket: socket id, ticket id, visitor key ('' for a stateless queue's ticket: a lease
-- only), sequence number.
--
-- Returns {outcome, presence_timeout_s, claim_ttl_s, news}:
--   outcome 'ok', or 'no_config' when the queue's policy is not in Redis (the leases are renewed anyway)
--   news = {i, code, ...}: the sockets (1-based, in ARGV's order) whose ticket is not simply waiting in
--   line, so the server reads their status (which says what happened): code 2 admitted, 3 active, 4..6
--   finished (completed, expired, revoked), 0 no such ticket (finished long ago, replaced, or lost with
--   the state: the status read restores it when it can), -1 parked (absent at the head: a status read
--   puts it back in its place), -2 overdue (the status read reports it expired).
-- A waiting visitor's record is written only when its second of presence changed.

local now, lease = tonumber(ARGV[1]), tonumber(ARGV[2])
local base = string.sub(K_CFG, 1, -4)  -- the queue's keys are '<prefix>:{slug}:<name>' (store.QueueKeys)
local K_WATCHERS = base .. 'watchers'

local p = policy()
local tracked = p and p.mode ~= 'stateless'
local second = math.floor(now / 1000)
local news, seen = {}, {}
for i = 1, (#ARGV - 2) / 4 do
  local at = 2 + 4 * (i - 1)
  local socket, tid, vk, seq = ARGV[at + 1], ARGV[at + 2], ARGV[at + 3], tonumber(ARGV[at + 4])
  local sockets = base .. 'sockets:' .. tid
  redis.call('ZADD', sockets, now + lease, socket)
  redis.call('PEXPIRE', sockets, lease)
  redis.call('ZADD', K_WATCHERS, now + lease, tid)
  local code = seen[tid]
  if tracked and vk ~= '' and code == nil then
    local rec = load(vk)
    if not rec or rec[R_SEQ] ~= seq then
      code = 0
    elseif rec[R_STATUS] <= ACTIVE and overdue(p, rec, now) then
      code = -2
    elseif rec[R_STATUS] ~= WAITING then
      code = rec[R_STATUS]
    elseif not line_has(tid, line_score_of(rec)) then
      code = -1
    else
      code = false  -- waiting in line: seen, no news
      if rec[R_SEEN] < second then  -- (never back: a notice's promise is later, notice.lua)
        rec[R_SEEN] = second
        save(vk, rec)
      end
    end
    seen[tid] = code
  end
  if code then
    news[#news + 1] = i
    news[#news + 1] = code
  end
end
redis.call('ZREMRANGEBYSCORE', K_WATCHERS, '-inf', now)
redis.call('PEXPIRE', K_WATCHERS, lease)
if not p then return {'no_config', 0, 0, news} end
return {'ok', p.presence_timeout, p.claim_ttl, news}
