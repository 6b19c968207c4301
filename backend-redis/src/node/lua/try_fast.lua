-- TRY (fast path of an exclusive `try` acquire): KEYS lock, fence, queue, shared (the readers);
-- ARGV owner, ttl_ms, token floor (0 = none)
-- Returns {token, owner} when granted (the lock was free, nobody queued, nobody reading), {0,
-- fence} when the lock is held and nobody queued or reading (fence: the counter's value, the
-- holder's token; Redlock's acquirer takes a token above every fence it hears of), -1 when
-- someone is queued or a read hold is recorded (the caller then runs `acquire` in `try` mode,
-- which drops dead waiters and expired readers first and never jumps live ones).
--
-- The order keeps a refused try to two or three commands and a grant to three: a queue or a
-- reader means the full script must decide (one EXISTS asks both); otherwise SET NX both tests
-- and takes the lock, and only a grant draws a token (INCR runs in the same atomic step, so
-- nobody sees the lock without it). The token is max(fence + 1, floor), and the counter moves to
-- it in the same step.
if redis.call('EXISTS', KEYS[3], KEYS[4]) > 0 then
  return -1
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {0, redis.call('GET', KEYS[2]) or 0}
end
local token = redis.call('INCR', KEYS[2])
if token < tonumber(ARGV[3]) then
  token = tonumber(ARGV[3])
  redis.call('SET', KEYS[2], ARGV[3])
end
return {token, ARGV[1]}
