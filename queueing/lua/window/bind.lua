-- window/bind.lua: bind a stateless queue's access token to the first browser that presents it.
--
-- KEYS[1] the token's binding (a STRING under the queue's hash tag)
-- ARGV[1] the digest of the presenting browser's secret ('' when the site sends none)
-- ARGV[2] the token's expiry (ms)   ARGV[3] '1' to hand it over to this browser on purpose
--
-- Returns 1 when this browser may use the token (it was free, or is bound here), 0 when another holds it.
-- The key goes when the token expires: per admitted visitor, nothing outlives its token.
local bound = redis.call('GET', KEYS[1])
if ARGV[1] == '' then return 1 end  -- no browser to bind: the site checks the token only
if bound and bound ~= ARGV[1] and ARGV[3] ~= '1' then return 0 end
if bound ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2]) end
return 1
