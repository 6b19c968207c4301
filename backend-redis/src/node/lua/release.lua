-- RELEASE: KEYS lock, fence, queue, alive; ARGV owner, token, wakes (channel prefix), client id
-- Frees the lock only if it is this lease's: the lock key names its owner id and the fence holds
-- its token (tokens are drawn only by a grant, so while a lock is held the fence is its holder's
-- token). A plain holder (see `common.lua`) had nobody queue behind it, so its key is deleted and
-- that is all. A marked one takes its own queue entry out (a Redlock waiter keeps its entry
-- through the vote, see `acquire`), leaves the key RESERVED for the queue (deleted if nobody
-- live is left in it), and wakes the head waiter.
-- Returns 1 when released, 0 when the lease was no longer current. The plain case is
-- `release_head.lua`, pasted at the `--@head` line.
--@head
--@common
local now = now_ms()
if holder_of(held[1], now) ~= ARGV[1] then
  return 0
end
prune(KEYS[3], KEYS[4], now)
redis.call('ZREM', KEYS[3], ARGV[1] .. ARGV[4])
redis.call('ZREM', KEYS[4], ARGV[1] .. ARGV[4])
vacate(KEYS[1], KEYS[3])
wake_first(KEYS[3], ARGV[3])
return 1
