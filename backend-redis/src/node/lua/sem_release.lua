-- SEM_RELEASE: KEYS holders, queue, alive; ARGV member (`<owner id>:<token>`), wakes (channel
--              prefix), last ('1': wake only when no live holder is left)
-- Frees the permit only if it is this lease's and has not run out: the member names both the
-- owner id and the token, so another owner's lease, or an earlier permit of the same owner, frees
-- nothing. Then, as a permit is free, wakes the head waiter, if any.
-- A reader of a read-write lock is released by this script too, on the lock's `shared` ZSET and
-- queue, with last = '1': a writer at the head needs every reader gone, so only the last
-- reader's release wakes it (a reader never waits for readers; no writer holds while a reader
-- does, so the lock is free then).
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
if redis.call('EXISTS', KEYS[2]) == 1
    and (ARGV[3] ~= '1' or redis.call('ZCOUNT', KEYS[1], string.format('(%d', now), '+inf') == 0) then
  prune(KEYS[2], KEYS[3], now)
  wake_first(KEYS[2], ARGV[2])
end
return 1
