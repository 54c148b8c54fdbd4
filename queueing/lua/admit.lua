-- admit.lua: WAITING -> ADMITTED for as many present visitors at the head as the policy allows.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] now (ms)
-- ARGV[2] leader token, or '' when triggered by a freed slot (complete, revoke, expiry)
-- ARGV[3] most tickets to admit in this call
-- ARGV[4] most line entries to look at in this call
-- ARGV[5] how often (ms) the leader's tick makes the estimate's model while people wait (WR_MODEL_SECONDS)
--
-- Returns {outcome, admitted, expired, figures, moves}:
--   outcome 'ok' | 'not_leader' (a tick whose leader token is stale: admits nothing) | 'no_config'
--   admitted  = {{tid, fence, expires_ms, joined_ms, est_wait_at_join_s}, ...}
--   expired   = ticket ids whose claim or session ran out (dropped first, freeing their slots)
--   figures   = what the script saw of the queue (see _policy.lua figures())
--   moves     = {event sequence, moves} (see _lib.lua): admitted and parked tickets left the line
--
-- Free slots = capacity - used (counted, or reported by the site); tokens come from a bucket refilled
-- by elapsed time. Walking the line from the head: a visitor not seen within presence_timeout is
-- parked (it keeps its place and returns to it when seen again, so the next walk does not meet it
-- again); a present one is admitted while slots and tokens last. Premium (level 3) needs only a slot:
-- its token may put the bucket into debt (down to -burst). A tick (leader token given) must hold the
-- leader lease: a runner that lost it while paused is fenced off here, not just in Python.

local now, token = tonumber(ARGV[1]), ARGV[2]
local max_admit, scan_limit, model_every = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5]) or 1000

if token ~= '' and redis.call('GET', K_LEADER) ~= token then
  return {'not_leader', {}, {}, {}, {0, {}}}
end
local p = policy()
if not p then return {'no_config', {}, {}, {}, {0, {}}} end
if p.mode == 'stateless' then return {'ok', {}, {}, {}, {0, {}}} end  -- the window admits (lua/window/)

local expired = expire_slots(now, max_admit)
local st = hash_table(K_ST)
if st.idle then  -- the first round since the ticks left the queue alone (idle.lua): not a slow line meanwhile
  st.ema_ts = nil
  redis.call('HDEL', K_ST, 'idle', 'idle_of')
end
opened_note(p, st, now)
local waiting = line_count()

local tokens, ts = bucket_tokens(p, st, now)
local admitted = {}
local spent = 0
local hazard, learnt = hazard_load(st), false  -- walking away, from the departures at the head
if admitting(p, now) and waiting > 0 then
  local free = math.min(capacity_now(p, st, now) - used_slots(p, st), max_admit)
  local budget = whole_tokens(tokens)
  local present_since = math.floor(now / 1000) - p.presence_timeout
  local offset, scanned, chunk, done = 0, 0, 64, free <= 0
  while not done do
    local batch, scores = line_range(offset, offset + chunk - 1)
    if #batch == 0 then break end
    for j, tid in ipairs(batch) do
      if scanned >= scan_limit then done = true break end
      scanned = scanned + 1
      local rec = load(vk_of(tid))
      if not rec or rec[R_STATUS] ~= WAITING or ticket_id(rec[R_SEQ], vk_of(tid)) ~= tid then
        line_remove(tid, scores[j])  -- a stray entry; never admit it
        offset = offset - 1
      elseif rec[R_SEEN] < present_since then
        park(tid, rec)
        offset = offset - 1
        hazard = hazard_note(hazard, 1, waited_s(rec, now, true))
      elseif rec[R_PRI] == 3 or spent < budget then
        line_remove(tid, scores[j])
        offset = offset - 1
        hazard = hazard_note(hazard, 0, waited_s(rec, now, false))
        admitted[#admitted + 1] = admit(p, tid, rec, now)
        spent = spent + 1
        if #admitted >= free then done = true break end
      else
        done = true  -- no token left for this one, and those behind it are no more entitled
        break
      end
    end
    offset = offset + #batch
  end
  tokens = math.max(tokens - spent, math.min(tokens, -p.burst))
  learnt = scanned > 0
end
if #LAPSED > 0 then hazard, learnt = hazard_lapsed(hazard, LAPSED), true end
bucket_save(tokens, ts)
rate_update(st, now, #admitted, admitting(p, now) and waiting > 0)
-- The leader's tick, once a second, makes the model when it is due (_estimates.lua model_tick; the looks
-- save the head's sums with the line's). Otherwise: admissions since the model was made move everyone up
-- by those they took out of the line (admitted, parked, strays: all from its head), so the table's places
-- are read that many further back (waits_read), and the look's places that many nearer (line_look).
-- The head's join (head_js, the oldest wait ahead of everyone) is noted again by a tick that moved the
-- head, as the look notes it: a head a few seconds gone had those ahead taken to have waited that long more.
if token == '' or not model_tick(p, st, now, hazard, waiting, model_every) then
  if learnt then hazard_save(hazard) end
  local moved_up = waiting - line_count()
  if moved_up > 0 and (st.wt or st.lj) then redis.call('HINCRBY', K_ST, 'wto', moved_up) end
  if moved_up > 0 and token ~= '' then
    local head = line_range(0, 0)
    local first = head[1] and load(vk_of(head[1]))
    redis.call('HSET', K_ST, 'head_js', first and first[R_JOINED] or now)
  end
end

local moves = moves_reply()
st = figure_stats('reply')
return {'ok', admitted, expired, figures(p, st), moves}
