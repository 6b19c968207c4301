-- READ: KEYS hash, readers; ARGV reader id, ttl_ms, op ('enter' | 'exit' | 'renew' | 'unwait'),
--       token floor (0 = none; used by enter)
-- enter: in one step, refuses while a writer holds the lock or waits for it, else adds the reader with its
--        expiry (readers whose expiry passed are dropped first). The writer's expireLock checks
--        the readers in one step too, so a reader and a writer can never both get in.
-- exit:  removes the reader. renew: moves a present reader's expiry. unwait: clears the
--        `writer waiting` mark of the writer ARGV[1] (it gave up).
-- Returns for enter {1, expiry, version} (the version bumped, to at least the floor: the
-- reader's fencing token) or
-- {0, writer's expiry, writer}; for exit and renew
-- 1 when the reader was there, else 0.
--@tair
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', int(now))
if ARGV[3] == 'exit' then
  return redis.call('ZREM', KEYS[2], ARGV[1])
end
if ARGV[3] == 'unwait' then
  -- A waiting writer (ARGV[1]) gives up: its mark goes, if it is still its own.
  if redis.call('HGET', KEYS[1], 'wwait') == ARGV[1] then
    return redis.call('HDEL', KEYS[1], 'wwait', 'wwait_until') > 0 and 1 or 0
  end
  return 0
end
local expiry = now + tonumber(ARGV[2])
if ARGV[3] == 'renew' then
  if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    redis.call('ZADD', KEYS[2], int(expiry), ARGV[1])
    return 1
  end
  return 0
end
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'version', 'wwait', 'wwait_until')
if h[1] == '1' and tonumber(h[2]) > now then
  return {0, h[2], h[3]}
end
if h[5] and tonumber(h[6] or '0') > now then
  return {0, h[6], h[5]}
end
redis.call('ZADD', KEYS[2], int(expiry), ARGV[1])
-- Every hold gets a token above every earlier one, a reader's too.
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
if version < tonumber(ARGV[4]) then
  version = tonumber(ARGV[4])
  redis.call('HSET', KEYS[1], 'version', ARGV[4])
end
return {1, int(expiry), version}
