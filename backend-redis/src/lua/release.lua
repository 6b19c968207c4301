-- RELEASE: KEYS lock, queue, alive; ARGV holder value ("<owner>:<token>"), channel
-- Deletes the lock only if the value is this lease's; then wakes the head waiter, if any.
-- Returns 1 when released, 0 when the lease was no longer current.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[2]) == 0 then
  return 1
end
--@common
prune(KEYS[2], KEYS[3], now_ms())
wake_head(KEYS[1], KEYS[2], ARGV[2])
return 1
