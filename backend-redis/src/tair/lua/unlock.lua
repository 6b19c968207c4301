-- EXPIRE_UNLOCK: KEYS hash, readers, queue, alive; ARGV expiry proof ('' = any), owner ('' = any),
--                whole (1|0), wakes (channel prefix)
-- Unlocks only a lock that is still locked with exactly this proof (and, when given, this
-- owner): a stale or wrong proof changes nothing. A reentrant holder counts down first, unless
-- whole = 1. An unlock wakes the head of dlock's queue, if anyone waits (the hash's `busy` mark
-- says whether anyone may: see `common.lua`).
-- Returns 1 when unlocked, 2 when counted down (still held), 0 when the proof is not current.
--
-- Everything up to the wake-up runs before the prelude (Redis makes every helper of the prelude
-- anew on each call), so an unlock with nobody queued defines none of them; `write_held` is
-- written out here.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'owner', 'count', 'proof', 'busy')
if not (h[1] == '1' and tonumber(h[2] or '0') > now) then
  return 0
end
if (ARGV[1] ~= '' and h[5] ~= ARGV[1]) or (ARGV[2] ~= '' and h[3] ~= ARGV[2]) then
  return 0
end
if ARGV[3] ~= '1' and tonumber(h[4] or '1') > 1 then
  redis.call('HINCRBY', KEYS[1], 'count', -1)
  return 2
end
redis.call('HSET', KEYS[1], 'locked', '0', 'count', '0')
if not h[6] then
  return 1
end
--@tair
prune(KEYS[3], KEYS[4], now)
wake_if_free(KEYS[1], KEYS[2], KEYS[3], ARGV[4], now)
settle(KEYS[1], KEYS[2], KEYS[3])
return 1
