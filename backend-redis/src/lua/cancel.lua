-- CANCEL: KEYS lock, queue, alive; ARGV owner, channel
-- Undoes an acquire whose caller went away: leaves the queue, and deletes the lock if it was
-- granted to this owner meanwhile. Then wakes the next head if the lock is free.
-- Returns 1 if a lock granted to the owner was deleted, else 0.
--@common
local owner = ARGV[1]
local removed = redis.call('ZREM', KEYS[2], owner)
redis.call('ZREM', KEYS[3], owner)
local released = 0
if redis.call('GET', KEYS[1]) == owner then
  redis.call('DEL', KEYS[1])
  released = 1
end
if removed == 1 or released == 1 then
  wake_head(KEYS[1], KEYS[2], ARGV[2])
end
return released
