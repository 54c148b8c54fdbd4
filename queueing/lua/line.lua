-- line.lua: places of the line in order, for the dashboard, tools and checks (not a request path): the
-- line is kept in buckets (_line.lua, line_add), which only the library walks.
--
-- KEYS: the standard queue keys (see _lib.lua).
-- ARGV[1] first place (0-based)   ARGV[2] last place (inclusive; -1: the last)
-- Returns {everyone in line, {ticket id, score, ...}}: scores as text (a reply would drop their fractions).

local members, scores = line_range(tonumber(ARGV[1]), tonumber(ARGV[2]))
local out = {}
for i, tid in ipairs(members) do
  out[#out + 1] = tid
  out[#out + 1] = fmt(scores[i])
end
return {line_count(), out}
