-- INSPECT: KEYS hash, readers, queue, alive
-- Returns {holder or '', ms left (-1 when free), version (0 when never locked), live readers,
-- live waiters in dlock's queue}.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'version')
local readers = redis.call('ZCOUNT', KEYS[2], '(' .. int(now), '+inf')
local waiters = redis.call('ZCOUNT', KEYS[4], '(' .. int(now), '+inf')
if write_held(h[1], h[2], now) then
  return {h[3], tonumber(h[2]) - now, tonumber(h[4]), readers, waiters}
end
return {'', -1, tonumber(h[4] or '0'), readers, waiters}
