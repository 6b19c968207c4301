-- EXTEND: KEYS lock, fence; ARGV owner, token, ttl_ms
-- Sets a new ttl only if the lock is still this lease's (owner id in the lock key, token in the
-- fence, as for release): an expired or taken lock stays gone.
-- Returns 1 when extended, 0 when the lease was no longer current.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[1] == ARGV[1] and held[2] == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return 0
