-- EXTEND: KEYS lock, fence; ARGV owner, token, ttl_ms
-- Sets a new ttl only if the lock is still this lease's (owner id in the lock key, token in the
-- fence, as for release): an expired or taken lock stays gone. A plain holder's key gets the new
-- expiry; a marked one's (see `common.lua`) gets the new deadline, and its key lives at least as
-- long.
-- Returns 1 when extended, 0 when the lease was no longer current.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[2] ~= ARGV[2] then
  return 0
end
if held[1] == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
--@common
local now = now_ms()
if holder_of(held[1], now) ~= ARGV[1] then
  return 0
end
local ttl = tonumber(ARGV[3])
local keep = math.max(ttl, redis.call('PTTL', KEYS[1]))
redis.call('SET', KEYS[1], marked(ARGV[1], now + ttl), 'PX', keep)
return 1
