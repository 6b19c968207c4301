-- EXPIRE_UNLOCK: KEYS hash, readers, queue, alive; ARGV expiry proof ('' = any), owner ('' = any),
--                whole (1|0), wakes (channel prefix)
-- Unlocks only a lock that is still locked with exactly this proof (and, when given, this
-- owner): a stale or wrong proof changes nothing. A reentrant holder counts down first, unless
-- whole = 1. An unlock wakes the head of dlock's queue, if anyone waits.
-- Returns 1 when unlocked, 2 when counted down (still held), 0 when the proof is not current.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'count', 'proof')
if not write_held(h[1], h[2], now) then
  return 0
end
if (ARGV[1] ~= '' and h[5] ~= ARGV[1]) or (ARGV[2] ~= '' and h[3] ~= ARGV[2]) then
  return 0
end
if ARGV[3] ~= '1' and tonumber(h[4] or '1') > 1 then
  redis.call('HINCRBY', KEYS[1], 'count', -1)
  return 2
end
redis.call('HSET', KEYS[1], 'locked', 0, 'count', 0)
if redis.call('EXISTS', KEYS[3]) == 1 then
  prune(KEYS[3], KEYS[4], now)
  wake_if_free(KEYS[1], KEYS[2], KEYS[3], ARGV[4], now)
end
return 1
