-- SEM_EXTEND: KEYS holders, then for a reader the lock; ARGV member (`<owner id>:<token>`), ttl_ms
-- Moves the permit's expiry to now + ttl (server time) only if it is still this lease's and has
-- not run out: an expired or freed permit stays gone. The token does not change. A reader of a
-- read-write lock is extended by this script too, on the lock's `shared` ZSET (same members),
-- and the lock key (RESERVED while a reader holds, see `common.lua`) is kept as long.
-- Returns 1 when extended, 0 when the lease was no longer current.
--@common
local now = now_ms()
local expires = redis.call('ZSCORE', KEYS[1], ARGV[1])
if expires and tonumber(expires) > now then
  redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[2]), ARGV[1])
  if KEYS[2] then
    keep_for(KEYS[2], tonumber(ARGV[2]))
  end
  return 1
end
return 0
