-- FORGET: KEYS lock, fence, queue, alive, seq
-- Deletes the fence counter, the queue and the ticket counter of a name nobody holds or waits for.
-- Returns 1 when nothing of the name is left, 0 when it is held or has live waiters.
--@common
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('ZCOUNT', KEYS[4], string.format('(%d', now_ms()), '+inf') > 0 then
  return 0
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return 1
