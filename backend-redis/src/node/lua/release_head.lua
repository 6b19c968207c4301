-- The first step of both releases (`release.lua`, `release_plain.lua`), pasted at their
-- `--@head` line: KEYS[1] lock, KEYS[2] fence; ARGV[1] owner, ARGV[2] token. Returns 0 when
-- the lease is no longer current (the fence moved on with a later grant, or the key is gone),
-- and 1 after deleting the key when it still holds this owner's plain form (nobody queued or
-- read since the grant). Otherwise it falls through with `held` = {lock's value, fence}.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[2] ~= ARGV[2] or not held[1] then
  return 0
end
if held[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
