-- RELEASE: KEYS lock, fence, queue, alive; ARGV owner, token, wakes (channel prefix), client id
-- Deletes the lock only if it is this lease's: the lock key holds its owner id and the fence its
-- token (tokens are drawn only by a grant, so while a lock is held the fence is its holder's
-- token). Then takes the holder's own queue entry out (a Redlock waiter keeps its entry through
-- the vote, see `acquire`), and wakes the head waiter, if any.
-- Returns 1 when released, 0 when the lease was no longer current.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[1] ~= ARGV[1] or held[2] ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
--@common
prune(KEYS[3], KEYS[4], now_ms())
redis.call('ZREM', KEYS[3], ARGV[1] .. ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[1] .. ARGV[4])
wake_head(KEYS[1], KEYS[3], ARGV[3])
return 1
