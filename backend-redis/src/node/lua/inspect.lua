-- INSPECT: KEYS lock, fence, queue, alive
-- Returns {holder owner id or '', pttl, last token or -1, live waiters, queued entries}. While the
-- lock is held the last token is its holder's (tokens are drawn only by a grant).
--@common
local v = redis.call('GET', KEYS[1]) or ''
local fence = tonumber(redis.call('GET', KEYS[2]) or '-1')
local now = now_ms()
-- The holder is not a waiter, though a Redlock holder keeps its queue entry until it releases.
local live = 0
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], string.format('(%d', now), '+inf')) do
  if string.sub(w, 1, 32) ~= v then
    live = live + 1
  end
end
return {v, redis.call('PTTL', KEYS[1]), fence, live, redis.call('ZCARD', KEYS[3])}
