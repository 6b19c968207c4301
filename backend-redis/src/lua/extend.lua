-- EXTEND: KEYS lock; ARGV holder value ("<owner>:<token>"), ttl_ms
-- Sets a new ttl only if the lock is still this lease's: an expired or taken lock stays gone.
-- Returns 1 when extended, 0 when the lease was no longer current.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
