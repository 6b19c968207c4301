-- EXPIRE_LOCK: KEYS hash, readers; ARGV owner, ttl_ms, reentrant (1|0), waiting_ms (0 = not a
-- waiting writer), token floor (0 = none)
-- Locks only in the unlocked state (flag clear, or expiry passed) and when no reader holds the
-- key; an expired lock is taken over in the same step. The new expiry is above the old one even
-- within the same millisecond, so a stale proof never equals a newer holder's.
-- With reentrant = 1, the holder locking again counts up and keeps its proof.
-- A waiting writer (waiting_ms > 0) that is refused marks the hash `writer waiting` until now +
-- waiting_ms: new readers stay out meanwhile, so a stream of readers cannot starve it. Its own
-- lock clears the mark.
-- A fresh lock's version is max(version + 1, floor), set in the same step.
-- Returns {1, proof, version, count} when locked (the proof is the expiry this lock set), {0, expiry, holder} when held by another,
-- {0, -1, 'readers'} when readers hold it.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'version', 'proof')
local expire = tonumber(h[2] or '0')
local function wait_mark()
  if tonumber(ARGV[4] or '0') > 0 then
    redis.call('HSET', KEYS[1], 'wwait', ARGV[1], 'wwait_until', int(now + tonumber(ARGV[4])))
  end
end
if h[1] == '1' and expire > now then
  if ARGV[3] == '1' and h[3] == ARGV[1] then
    local count = redis.call('HINCRBY', KEYS[1], 'count', 1)
    return {1, h[5], tonumber(h[4]), count}
  end
  wait_mark()
  return {0, int(expire), h[3]}
end
if redis.call('ZCOUNT', KEYS[2], '(' .. int(now), '+inf') > 0 then
  wait_mark()
  return {0, -1, 'readers'}
end
if redis.call('HGET', KEYS[1], 'wwait') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'wwait', 'wwait_until')
end
local new_expire = math.max(now + tonumber(ARGV[2]), expire + 1)
local version = redis.call('HINCRBY', KEYS[1], 'version', 1)
if version < tonumber(ARGV[5]) then
  version = tonumber(ARGV[5])
  redis.call('HSET', KEYS[1], 'version', ARGV[5])
end
redis.call('HSET', KEYS[1], 'locked', 1, 'expire', int(new_expire), 'proof', int(new_expire),
  'owner', ARGV[1], 'count', 1)
return {1, int(new_expire), version, 1}
