-- _line_upgrade.lua: a line kept before the buckets moves into them (part of the library: _lib.lua; the
-- buckets: _line.lua).
--!exports: line_upgrade

-- A line kept before the buckets (one ZSET at K_LINE itself) moves into them, scores into the records;
-- once, from policy_pack(), whose packed policy then says the layout: until then no script runs on the
-- queue (a policy packed before says no layout, and reads as not live: Python writes it again).
function line_upgrade()
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
