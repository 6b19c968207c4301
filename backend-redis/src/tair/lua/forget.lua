-- FORGET: KEYS hash, readers
-- Deletes a name nobody holds (no writer, no live reader), its version included.
-- Returns 1 when nothing of it is left, 0 when it is held.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire')
if (h[1] == '1' and tonumber(h[2]) > now) or redis.call('ZCOUNT', KEYS[2], '(' .. int(now), '+inf') > 0 then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
return 1
