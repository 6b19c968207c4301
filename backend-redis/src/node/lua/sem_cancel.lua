-- SEM_CANCEL: KEYS holders, queue, alive, count, terms; ARGV owner, client id, wakes (channel
--             prefix)
-- Undoes a permit acquire whose caller went away: leaves the queue, and frees every permit
-- granted to this owner id meanwhile, by its own attempt or handed over by a release (the
-- caller never saw its token, so the owner id is all it has: as for a lock, an owner id names
-- one acquisition). Then wakes the head waiter if a permit is free.
-- Returns 1 if a permit granted to the owner was freed, else 0.
--@common
local owner = ARGV[1]
local entry = owner .. ARGV[2]
local removed = redis.call('ZREM', KEYS[2], entry)
redis.call('ZREM', KEYS[3], entry)
redis.call('HDEL', KEYS[5], entry)
local released = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  if string.sub(member, 1, 32) == owner then
    redis.call('ZREM', KEYS[1], member)
    released = 1
  end
end
if removed == 1 or released == 1 then
  local now = now_ms()
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local permits = tonumber(redis.call('GET', KEYS[4]) or '0')
  if redis.call('ZCARD', KEYS[1]) < permits then
    prune(KEYS[2], KEYS[3], now, KEYS[5])
    wake_first(KEYS[2], ARGV[3])
  end
end
return released
