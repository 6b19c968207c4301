-- EXTEND: KEYS hash; ARGV expiry proof, owner, ttl_ms
-- Moves the expiry of a lock still held with this proof and owner to now + ttl (never earlier
-- than it was); the proof stays. An expired or taken lock stays gone.
-- Returns the new expiry, or 0.
--@tair
local now = now_ms()
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'proof')
if h[1] ~= '1' or h[4] ~= ARGV[1] or h[3] ~= ARGV[2] or tonumber(h[2]) <= now then
  return 0
end
local new_expire = math.max(now + tonumber(ARGV[3]), tonumber(h[2]))
redis.call('HSET', KEYS[1], 'expire', int(new_expire))
return int(new_expire)
