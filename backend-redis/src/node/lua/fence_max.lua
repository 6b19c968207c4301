-- FENCE_MAX (Redlock's write-back): KEYS fence; ARGV token
-- Raises the fence counter to `token` unless it is already there or beyond: a max-only update,
-- so a late or repeated write-back can never lower a counter.
-- Returns the counter's value afterwards.
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if current < token then
  redis.call('SET', KEYS[1], ARGV[1])
  return token
end
return current
