-- INSPECT: KEYS lock, fence, queue, alive
-- Returns {holder owner id or '', pttl, last token or -1, live waiters, queued entries}. While the
-- lock is held the last token is its holder's (tokens are drawn only by a grant).
--@common
local v = redis.call('GET', KEYS[1]) or ''
local fence = tonumber(redis.call('GET', KEYS[2]) or '-1')
local now = now_ms()
local live = redis.call('ZCOUNT', KEYS[4], string.format('(%d', now), '+inf')
return {v, redis.call('PTTL', KEYS[1]), fence, live, redis.call('ZCARD', KEYS[3])}
