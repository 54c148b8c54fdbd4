-- kept.lua: the keys a queue's tracked state holds besides its standard ones, for dropping a queue and for
-- tools (not a request path): the small hashes of waiting visitors' records (_lib.lua, record_slot: by the
-- visitor key's first two characters, its one for a one-character key) and the line's buckets and indexes
-- (_line.lua, line_add). Asked of the server by name, in the queue's slot, instead of by SCAN, which walks
-- the whole keyspace (each master's, on a cluster).
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] the visitor keys' alphabet (keys.parse_ticket_id's)
-- Returns {{record hashes that exist}, {line keys that exist}}.

-- The names of names[i..j] that exist: one EXISTS for the lot, then each half that holds any (a few
-- hundred calls for a handful of hashes of 4,160 names, where one EXISTS a name took 6 ms).
local function present(names, i, j, out)
  if redis.call('EXISTS', unpack(names, i, j)) == 0 then return end
  if i == j then
    out[#out + 1] = names[i]
    return
  end
  local mid = math.floor((i + j) / 2)
  present(names, i, mid, out)
  present(names, mid + 1, j, out)
end

local chars, names = ARGV[1], {}
for i = 1, #chars do
  local a = string.sub(chars, i, i)
  names[#names + 1] = K_TK .. ':' .. a
  for j = 1, #chars do
    names[#names + 1] = K_TK .. ':' .. a .. string.sub(chars, j, j)
  end
end
local records, line = {}, {}
present(names, 1, #names, records)
local kept = {K_LINE_F, K_LINE_I}
for _, b in ipairs(redis.call('ZRANGE', K_LINE_I, 0, -1)) do kept[#kept + 1] = K_LINE .. ':' .. b end
present(kept, 1, #kept, line)
return {records, line}
