-- FORGET: KEYS lock, fence, queue, alive, seq, then the semaphore's holders, fence, queue, alive,
--         seq, count, terms, then the lock's readers (shared)
-- The lock and the semaphore of one name are two objects, forgotten each on its own: the lock's
-- key (RESERVED or a lease that ran out), fence counter, queue, ticket counter and expired
-- readers unless the lock is held (by a writer or a live reader) or has live waiters; the
-- semaphore's keys (its fence counter and recorded count included) unless a permit is live or it
-- has live waiters.
-- Returns 1 when nothing of either is left, 0 when either is in use.
--@common
local now = now_ms()
local after = string.format('(%d', now)
local forgotten = 1
if holder_of(redis.call('GET', KEYS[1]), now) or redis.call('ZCOUNT', KEYS[4], after, '+inf') > 0
    or redis.call('ZCOUNT', KEYS[13], after, '+inf') > 0 then
  forgotten = 0
else
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[13])
end
if redis.call('ZCOUNT', KEYS[6], after, '+inf') > 0
    or redis.call('ZCOUNT', KEYS[9], after, '+inf') > 0 then
  forgotten = 0
else
  redis.call('DEL', KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11], KEYS[12])
end
return forgotten
