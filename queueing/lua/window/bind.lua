-- window/bind.lua: bind a stateless queue's access token to the first browser that presents it.
--
-- KEYS[1] the token's binding (a STRING under the queue's hash tag)   KEYS[2] win: the queue's window HASH
-- ARGV[1] the digest of the presenting browser's secret ('' for the site's own server-side check, '?'
-- for a verify without a secret that is not one: valid only while nobody has bound the token)
-- ARGV[2] the token's expiry (ms)   ARGV[3] '1' to hand it over to this browser on purpose
-- ARGV[4] the epoch the token was signed in   ARGV[5] the queue's row it was signed for ('0': not said)
--
-- Returns 'ok' when this browser may use the token (it was free, or is bound here), 'bound_elsewhere' when
-- another holds it, 'void' when the token is of an epoch this window does not know (every epoch of the
-- window records its gap, the first one's too; a change of mode forgets them: a sale before the change)
-- or of another queue made before under the same slug (judged only while the window is there). The
-- binding key goes when the token expires: per admitted visitor, nothing outlives its token.
local w = redis.call('HMGET', KEYS[2], 'epoch', 'gap:' .. ARGV[4], 'qid')
if w[1] and ((w[1] ~= ARGV[4] and not w[2]) or (ARGV[5] ~= '0' and w[3] and w[3] ~= ARGV[5])) then
  return 'void'  -- (no window: its state is being restored, the signature and expiry are all there is to check)
end
if ARGV[1] == '' then return 'ok' end  -- no browser to bind: the site checks the token only
local bound = redis.call('GET', KEYS[1])
if ARGV[1] == '?' then return bound and 'bound_elsewhere' or 'ok' end
if bound and bound ~= ARGV[1] and ARGV[3] ~= '1' then return 'bound_elsewhere' end
if bound ~= ARGV[1] then redis.call('SET', KEYS[1], ARGV[1], 'PXAT', ARGV[2]) end
return 'ok'
