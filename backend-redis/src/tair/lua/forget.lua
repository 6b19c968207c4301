-- FORGET: KEYS hash, readers, queue, alive, seq
-- Deletes a name nobody holds (no writer, no live reader) and nobody waits for (no live entry in
-- dlock's queue), its version and queue keys included.
-- Returns 1 when nothing of it is left, 0 when it is held or waited for.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire')
if write_held(h[1], h[2], now) or redis.call('ZCOUNT', KEYS[2], '(' .. int(now), '+inf') > 0
    or redis.call('ZCOUNT', KEYS[4], '(' .. int(now), '+inf') > 0 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return 1
