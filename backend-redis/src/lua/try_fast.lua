-- TRY (fast path of a `try` acquire): KEYS lock, fence, queue; ARGV owner, ttl_ms
-- Returns {token, owner} when granted (the lock was free and nobody queued), 0 when the lock is
-- held and nobody queued, -1 when someone is queued (the caller then runs `acquire` in `try`
-- mode, which drops dead waiters first and never jumps live ones).
if redis.call('EXISTS', KEYS[1], KEYS[3]) > 0 then
  if redis.call('EXISTS', KEYS[3]) == 1 then
    return -1
  end
  return 0
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ':' .. token, 'PX', ARGV[2])
return {token, ARGV[1]}
