-- SEM_RELEASE: KEYS holders, queue, alive; ARGV member (`<owner id>:<token>`), wakes (channel
--              prefix)
-- Frees the permit only if it is this lease's and has not run out: the member names both the
-- owner id and the token, so another owner's lease, or an earlier permit of the same owner, frees
-- nothing. Then, as a permit is free, wakes the head waiter, if any.
-- Returns 1 when released, 0 when the lease was no longer current (an expired member is pruned).
--@common
local now = now_ms()
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expires then
  return 0
end
redis.call('ZREM', KEYS[1], ARGV[1])
if tonumber(expires) <= now then
  return 0
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  prune(KEYS[2], KEYS[3], now)
  wake_first(KEYS[2], ARGV[2])
end
return 1
