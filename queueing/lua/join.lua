-- join.lua: (none) -> WAITING, or the visitor's existing live ticket (one live ticket per visitor).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] visitor key      ARGV[2] now (ms)     ARGV[3] priority level 0-3
-- ARGV[4] display name ('' for none)
-- ARGV[5] 1 when KEYS[12] is the client's address key   ARGV[6] proof-of-work bits solved (0: none)
-- ARGV[7] how long a proof-of-work challenge stays valid (ms)
-- KEYS[12] the client address's live tickets in this queue: ZSET member = ticket id, for the per-address
--          cap (max_tickets_per_address); pruned of finished tickets here, lazily
-- KEYS[13] the solved challenge's single-use marker (when ARGV[6] > 0)
-- The level's placement fraction (0 back .. 1 front) comes from the mirrored policy (pf1..pf3).
--
-- Returns {outcome, ticket, figures, moves} where outcome is
--   'created' | 'existing'   ticket = {tid, seq, status, rank or -1, fence, expires_ms, est_wait_s,
--                             reason, freed, priority, line score} as in status.lua; freed = 1 when
--                             the visitor's overdue previous ticket released a slot; the line score
--                             ('' when not in line) goes into the ticket, to restore the place after
--                             lost state
--   'closed' | 'full'        ticket = {}
--   'capped'                 ticket = {}: the address already holds max_tickets_per_address live tickets
--   'not_open'               ticket = {}: the pre-queue has not opened yet (prequeue_opens_at)
--   'pow_required'           ticket = {}: the queue's gate wants more proof of work than was shown
--   'pow_required:<bits>'    the same, the gate asking <bits> of this address (it holds live tickets already)
--   'pow_reused'             ticket = {}: that challenge was already spent on a join
--   'no_config'              the queue's policy is not in Redis: sync it and retry
--   'no_seq'                 the sequence numbers the database reserved are used up: reserve, retry
--   'stateless'              the queue runs in stateless mode (lua/window/join.lua joins it)
-- figures: see _policy.lua figures(); moves: see _transitions.lua moves_reply() (a priority joiner placed ahead
-- of others moves them back).
--
-- Placement (seed 003): level 0 goes to the back. Level L > 0 goes ahead of the last `fraction` of the
-- line, but never ahead of an earlier joiner of level L or higher still waiting (first come, first
-- served within a level), nor ahead of any ticket of an earlier epoch (`epoch_floor`, see epoch.lua);
-- `tL` in st remembers the last placement score per level. Scores are split
-- by halving; when a gap is exhausted, an equal score still sorts by ticket id, i.e. by sequence.
-- A premium joiner (level 3) at the head is admitted at once when a slot is free, even ahead of the
-- bucket (which may go into debt down to -burst); any joiner of an empty, open line is admitted at
-- once when a slot and a token are free.

local vk, now, pri = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local name = ARGV[4]

local p = policy()
if not p then return {'no_config', {}, {}, {0, {}}} end
if p.mode == 'stateless' then return {'stateless', {}, {}, {0, {}}} end
local st = figure_stats('join')
if p.state == 'open' then figure_stats('model', st) end  -- (its wait worked out)

local freed = 0
local rec = load(vk)
if rec and rec[R_STATUS] <= ACTIVE then
  local tid = ticket_id(rec[R_SEQ], vk)
  local reason = overdue(p, rec, now)
  if reason then
    freed = finish_overdue(tid, rec, reason, now)
    st = figure_stats('join')
    if p.state == 'open' then figure_stats('model', st) end
  else
    rec[R_SEEN] = math.max(rec[R_SEEN], math.floor(now / 1000))  -- (a notice's: notice.lua)
    save(vk, rec)
    local rank, est = -1, rec[R_EST]
    if rec[R_STATUS] == WAITING then
      rank = waiting_rank(tid, rec) or -1
      est = estimate_told(p, st, rec[R_PRI], rank, now, nil, rec[R_JOINED])
    end
    local reply = ticket_reply(tid, rec, rank, est, 0)
    if rank >= 0 then reply[11] = fmt(line_score_of(rec)) end
    return {'existing', reply, figures(p, st), moves_reply()}
  end
end

if p.state == 'closed' or (p.ends_ms > 0 and now >= p.ends_ms) then
  return {'closed', {}, figures(p, st), moves_reply()}
end
if p.prequeue_opens_ms > 0 and now < p.prequeue_opens_ms then return {'not_open', {}, figures(p, st), moves_reply()} end
local n = line_count()
if p.max_waiting > 0 and n + redis.call('ZCARD', K_AWAY) >= p.max_waiting then
  return {'full', {}, figures(p, st), moves_reply()}
end

if (tonumber(st.seq) or 0) >= p.seq_max then return {'no_seq', {}, figures(p, st), moves_reply()} end

local K_ADDRESS = nil
if ARGV[5] == '1' then K_ADDRESS = KEYS[12] end
local pow_bits, pow_ttl = tonumber(ARGV[6]) or 0, tonumber(ARGV[7]) or 0
if p.pow_difficulty > 0 and pow_bits < p.pow_difficulty then
  return {'pow_required', {}, figures(p, st), moves_reply()}
end
local live = 0
if K_ADDRESS and p.max_per_address > 0 then
  for _, held in ipairs(redis.call('ZRANGE', K_ADDRESS, 0, -1)) do
    local r = load(vk_of(held))
    if r and r[R_STATUS] <= ACTIVE and ticket_id(r[R_SEQ], vk_of(held)) == held then
      live = live + 1
    else
      redis.call('ZREM', K_ADDRESS, held)  -- finished, or replaced by that visitor's newer ticket
    end
  end
  if live >= p.max_per_address then return {'capped', {}, figures(p, st), moves_reply()} end
end
-- The gate asks a bit more of an address for each doubling of the live tickets it holds (issue 50: at a flat
-- 16 bits a hoarder's script paid 26 ms a ticket): its 2nd ticket 1 bit more, its 4th 2, its 8th 3, its 16th
-- 4. Known only while the per-address cap is on (its index). 'pow_required:<bits>' names the difficulty.
if p.pow_difficulty > 0 and live > 0 then
  local required = p.pow_difficulty + math.floor(math.log(live + 1) / math.log(2) + 1e-9)
  if pow_bits < required then return {'pow_required:' .. required, {}, figures(p, st), moves_reply()} end
end
if p.pow_difficulty > 0 and not redis.call('SET', KEYS[13], '1', 'NX', 'PX', pow_ttl) then
  return {'pow_reused', {}, figures(p, st), moves_reply()}  -- spent: one challenge, one join
end

local seq = redis.call('HINCRBY', K_ST, 'seq', 1)
local tid = ticket_id(seq, vk)

local score = priority_place(p, st, pri, n, seq)
if pri > 0 then redis.call('HSET', K_ST, 't' .. pri, fmt(score)) end
if score ~= seq then priority_note(st, pri, now) end  -- placed ahead of others (estimate_wait)

line_add(tid, score)
redis.call('HINCRBY', K_ST, 'joined', 1)
if rec then redis.call('ZREM', K_DONE, vk) end  -- a visitor with no record has no finished ticket kept
local rank = line_rank(tid, score)
local est = estimate_told(p, st, pri, rank, now)
rec = {seq, WAITING, pri, now, math.floor(now / 1000), name, est}
line_score_keep(rec, score)

-- Only from the head: an earlier premium joiner still waiting there goes first.
local admitted = false
if admitting(p, now) and rank == 0 and (pri == 3 or n == 0) and used_slots(p, st) < capacity_now(p, st, now) then
  local tokens, ts = bucket_tokens(p, st, now)
  if whole_tokens(tokens) >= 1 or pri == 3 then
    line_drop(tid, score)  -- never seen in line by anyone: no move to report
    admit(p, tid, rec, now)
    bucket_save(math.max(tokens - 1, -p.burst), ts)
    rate_update(st, now, 1, n > 0)
    rank, admitted = -1, true
  end
end
if not admitted then
  save(vk, rec)
  if rank < n then moved('+', rank) end  -- placed ahead of others
end

if K_ADDRESS and p.max_per_address > 0 then
  redis.call('ZADD', K_ADDRESS, now, tid)
  redis.call('PEXPIRE', K_ADDRESS, (p.abandon_timeout + p.claim_ttl + p.session_ttl) * 1000)
end

local moves = moves_reply()
if admitted then st = figure_stats('reply') elseif moves ~= 0 then st.evseq = moves[1] end
local reply = ticket_reply(tid, rec, rank, est, freed)
if not admitted then reply[11] = fmt(score) end
return {'created', reply, figures(p, st), moves}
