-- The minimal fenced acquire, for `dlock bench`'s fenced floor: KEYS key, fence; ARGV value, ttl_ms
-- Takes the key if free and draws the next fencing token in the same atomic step.
-- Returns the token when taken, 0 when the key was held.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
