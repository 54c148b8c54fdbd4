-- _policy.lua: the policy as the scripts read it, the counters a poll reads, the token bucket, a priority
-- joiner's place (part of the library: _lib.lua).
--!exports: figure_stats poll_stats num policy_pack server_id policy admitting capacity_now used_slots bucket_tokens
--!exports: whole_tokens bucket_save rate_update ema_update poll_figures figures priority_place

-- The counters a poll reads (figures() and estimate_wait(); HGETALL would build every other one too): first
-- those it needs when the tick's table of waits answers it, or when it needs no estimate (the figures
-- poll_figures() gives, the slots a site reports, the table), then the model's inputs (some of them long
-- texts), read only by a poll that works its wait out (status.lua) and by joins and ticks.
local POLL_FIELDS = {'evseq', 'w_lo', 'w_hi', 'svo', 'reported_in_use', 'wt', 'wto'}
local MODEL_FIELDS = {
  'admitted', 'ema_rate', 'ema_ts', 'ema_service_ms', 'b_tokens', 'b_ts', 'thetas', 'silent', 'pri', 'head_js',
  'lj', 'svr', 'svm', 'idle', 'restored_sessions',
}
local FIGURE_FIELDS = {}  -- (built with plain loops: the library's load sees no global, unpack included)
for i = 1, #POLL_FIELDS do FIGURE_FIELDS[i] = POLL_FIELDS[i] end
for i = 1, #MODEL_FIELDS do FIGURE_FIELDS[#FIGURE_FIELDS + 1] = MODEL_FIELDS[i] end
-- A join's (join.lua; HGETALL read every counter, twice a join: in a sale some 36 fields and 1 KB of the
-- ticks' texts): its reply's figures, the sequence, each level's last placement (priority_place), 'pri' and
-- 'wto'; then, on an open queue (a wait worked out), the model's other inputs ('model'). 'reply': the
-- figures of a reply only, read again after a round of admissions (or a join's) changed them.
local REPLY_FIELDS = {
  'evseq', 'w_lo', 'w_hi', 'svo', 'reported_in_use', 'ema_rate', 'ema_ts', 'ema_service_ms', 'admitted',
}
local JOIN_FIELDS, MODEL_REST, joined = {'seq', 't1', 't2', 't3', 'pri', 'wto'}, {}, {}
for i = 1, #REPLY_FIELDS do JOIN_FIELDS[#JOIN_FIELDS + 1] = REPLY_FIELDS[i] end
for i = 1, #JOIN_FIELDS do joined[JOIN_FIELDS[i]] = true end
for i = 1, #MODEL_FIELDS do
  if not joined[MODEL_FIELDS[i]] then MODEL_REST[#MODEL_REST + 1] = MODEL_FIELDS[i] end
end
local STATS_OF = {join = JOIN_FIELDS, model = MODEL_REST, reply = REPLY_FIELDS}

local function stats_read(fields, t)
  local values = redis.call('HMGET', K_ST, unpack(fields))
  for i = 1, #fields do t[fields[i]] = values[i] or nil end
  return t
end

-- figure_stats(): what the figures and the model read (the tick's table, status.lua's worked-out wait);
-- figure_stats(which[, st]): those above (added to st).
function figure_stats(which, st)
  return stats_read(which and STATS_OF[which] or FIGURE_FIELDS, st or {})
end

-- poll_stats(): the first; poll_stats(st): the model's inputs added to st, a poll's, to work a wait out.
function poll_stats(st)
  return stats_read(st and MODEL_FIELDS or POLL_FIELDS, st or {})
end

function num(t, field, default)
  local v = tonumber(t[field])
  if v == nil then return default end
  return v
end

-- What the packed policy holds, each {cfg field, the policy's name for it, its value when absent, text}: the
-- live state's own fields, then the queue's settings the scripts read (POLICY_SETTINGS, made from the table
-- of settings, queueing/policy_table.py, and put at this part's head when the library is assembled). The
-- packed copy begins with PACKED_TAG, which stands for this layout: a copy packed by a library of another
-- layout is packed again where policy() finds it.
local PACKED = {
  {'state', 'state', false, true}, {'live_epoch', 'live_epoch', false, true}, {'epoch', 'epoch', false, true},
  {'line_layout', 'line_layout', false, false}, {'server', 'server', '', true},
  {'target_url', 'target_url', '', true}, {'name', 'name', '', true}, {'shuffle_pending', 'shuffle_pending', '0', true},
  {'seq_max', 'seq_max', 0, false}, {'epoch_floor', 'epoch_floor', 0, false},
  {'restore_until_ms', 'restore_until_ms', 0, false}, {'restore_hold_until_ms', 'restore_hold_ms', 0, false},
  {'leader_ttl_ms', 'leader_ttl_ms', 3000, false},
  {'pf1', 'pf1', 0.1, false}, {'pf2', 'pf2', 0.5, false}, {'pf3', 'pf3', 1, false},
}
local PACKED_FIELDS, PACKED_TAG = {}, nil
local function layout()  -- (at its first use: while the library loads, Lua's own functions are out of reach)
  if PACKED_TAG then return end
  PACKED_TAG = 0
  for _, field in ipairs(POLICY_SETTINGS) do PACKED[#PACKED + 1] = field end
  for i, field in ipairs(PACKED) do
    PACKED_FIELDS[i] = field[1]
    for c in string.gmatch(field[1] .. '>' .. field[2] .. ';', '.') do
      PACKED_TAG = (PACKED_TAG * 31 + string.byte(c)) % 2147483647
    end
  end
end

function policy_pack()
  layout()
  line_upgrade()
  local values = redis.call('HMGET', K_CFG, unpack(PACKED_FIELDS))
  local packed = {PACKED_TAG}
  for i, field in ipairs(PACKED) do
    local value = values[i]
    if value and not field[4] then value = tonumber(value) or false end
    packed[i + 1] = value
  end
  redis.call('HSET', K_CFG, 'packed', cjson.encode(packed))
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

-- nil: packed by a library of another layout
local function policy_decode(packed)
  layout()
  local v = cjson.decode(packed)
  if v[1] ~= PACKED_TAG then return nil end
  local p = {}
  for i, field in ipairs(PACKED) do p[field[2]] = v[i + 1] or field[3] end
  p.live = p.state and p.live_epoch == p.epoch and p.line_layout == LINE_LAYOUT
  p.epoch = tonumber(p.epoch) or 1
  p.adaptive = p.adaptive == '1'
  p.shuffle_pending = p.shuffle_pending == '1'  -- a shuffled start's draw still to come
  p.fractions = {[1] = p.pf1, [2] = p.pf2, [3] = p.pf3}
  return p
end

-- The server a queue's state is on (SPEC 3.6): a Redis Cluster node's id ('c' .. CLUSTER MYID) or a single
-- Redis's run id ('r' .. run_id from INFO). A replica promoted by a failover, or a server started again
-- from its append-only file, is another server. Asked once per server process: the library's locals live
-- as long as its Lua state, which a restart (or a new library) makes again.
local THIS_SERVER = nil

function server_id()
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

function policy()
  local raw = redis.call('HMGET', K_CFG, 'packed', 'live_epoch')
  if not raw[1] or not raw[2] then return nil end
  local p = POLICIES[raw[1]]
  if not p then
    p = policy_decode(raw[1])
    if not p then
      policy_pack()
      raw = redis.call('HMGET', K_CFG, 'packed', 'live_epoch')
      p = policy_decode(raw[1])
    end
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
function admitting(p, now)
  return p.state == 'open' and now >= p.starts_at_ms and not p.shuffle_pending
    and (p.ends_ms == 0 or now < p.ends_ms)
end

-- The slots admission may fill. After lost state (epoch.lua) the sessions that were live are unknown but
-- were at most capacity; until the hold ends, each one that came back (restored_sessions) proves one slot
-- free of them, so only that many slots count: new admissions fill only slots restored sessions left.
function capacity_now(p, st, now)
  if now < p.restore_hold_ms then return math.min(p.capacity, num(st, 'restored_sessions', 0)) end
  return p.capacity
end

function used_slots(p, st)
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
function bucket_tokens(p, st, now)
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
function whole_tokens(tokens)
  return math.floor(tokens + 1e-6)
end

function bucket_save(tokens, ts)
  redis.call('HSET', K_ST, 'b_tokens', fmt(tokens), 'b_ts', ts)
end

-- Continuous-time EMA of admissions per second (time constant RATE_TAU_S). It decays only while
-- someone was waiting and the queue was open, so a quiet spell does not read as a slow line.
function rate_update(st, now, admitted, busy)
  local ema = num(st, 'ema_rate', 0)
  local ts = num(st, 'ema_ts', now)
  if busy and now > ts then ema = ema * math.exp(-(now - ts) / 1000 / RATE_TAU_S) end
  ema = ema + admitted / RATE_TAU_S
  redis.call('HSET', K_ST, 'ema_rate', fmt(ema), 'ema_ts', math.max(ts, now))
end

-- Seed 004: new = old * 0.9 + sample * 0.1.
function ema_update(field, sample)
  local old = tonumber(redis.call('HGET', K_ST, field))
  local new = sample
  if old ~= nil then new = old * 0.9 + sample * 0.1 end
  redis.call('HSET', K_ST, field, fmt(new))
end

-- What a poll's answer needs about the queue right now (status.lua; store.PollFigures). `used`: the slots in
-- use, when the caller has counted them already (estimate_wait takes them too: one count a poll).
local FIRST_RANGE = nil  -- the first range's texts, {lo, hi}: formatted once (printf's work)

function poll_figures(p, st, used)
  if not FIRST_RANGE then FIRST_RANGE = {fmt(WAIT_LO_FIRST), fmt(WAIT_HI_FIRST)} end
  return {
    p.state, p.capacity, used or used_slots(p, st), line_count(), st.evseq or '0',
    p.presence_timeout, p.target_url, p.epoch, p.claim_ttl, p.starts_at_ms,
    st.w_lo or FIRST_RANGE[1], st.w_hi or FIRST_RANGE[2],
    st.svo and st.svo:match(' (%S+)$') or '0',  -- a slot held by one who left: when it ends (returns_look)
  }
end

-- What wait estimates, stats and broadcasts need as well (join, admit; store.QueueFigures): the poll's
-- figures, then these.
function figures(p, st)
  local f = poll_figures(p, st)
  f[14], f[15], f[16], f[17] = fmt(p.outflow), st.ema_rate or '0', st.ema_ts or '0', st.ema_service_ms or '0'
  f[18], f[19], f[20] = num(st, 'admitted', 0), redis.call('ZCARD', K_AWAY), p.name
  return f
end

-- Priority joiners placed ahead (join.lua: a level's joiner goes in at its placement fraction from the
-- back): st.pri holds each level's arrival rates (_estimates.lua priority_rates); a queue nobody joined
-- with a code has none and pays nothing for this.
-- Where a visitor of level `pri` goes in a line of `n` (seed 003; join.lua's header tells the rule): the
-- score `seq` for level 0, or when the level's placement fraction is 0 or the line is empty; else ahead of
-- the last `fraction` of the line, but never ahead of an earlier joiner of its level or higher (tL in st)
-- or of any ticket of an earlier epoch (epoch_floor). join.lua places joiners; promote.lua, code holders.
function priority_place(p, st, pri, n, seq)
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
