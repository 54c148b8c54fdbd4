-- waits_drop.lua: drop the wait samples the dashboard has stored in its database
-- (admin_dashboard.services.wait_samples_store reads them, stores them, then calls this).
--
-- KEYS: the standard queue keys (see _lib.lua); only KEYS[10] (waits) is touched.
-- ARGV[1] the last sample stored, exactly as it was read
-- ARGV[2] how many samples were read (the last one is among the first that many)
--
-- Returns how many samples were dropped: everything up to and including ARGV[1], or 0 when it is no
-- longer in the list. Samples are only ever appended at the end, and the list is only trimmed from
-- the front (here, and by admissions keeping the newest WAITS_KEEP), so whatever still lies before the
-- last stored sample was stored too, and whatever came after it was not: nothing is lost or dropped
-- unstored, however the read, the database write and this call interleave with admissions.

local at = redis.call('LPOS', K_WAITS, ARGV[1], 'MAXLEN', tonumber(ARGV[2]))
if not at then return 0 end
redis.call('LTRIM', K_WAITS, at + 1, -1)
return at + 1
