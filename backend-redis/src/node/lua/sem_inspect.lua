-- SEM_INSPECT: KEYS holders, fence, queue, alive, count
-- Returns {last token or -1, recorded count or 0, live waiters, queued entries, member, ms left,
-- member, ms left, ...} for every live permit (members `<owner id>:<token>`). Read-only: expired
-- permits and dead waiters are left for the next acquire to prune, and not reported.
--@common
local now = now_ms()
local fence = tonumber(redis.call('GET', KEYS[2]) or '-1')
local count = tonumber(redis.call('GET', KEYS[5]) or '0')
local live = redis.call('ZCOUNT', KEYS[4], string.format('(%d', now), '+inf')
local out = {fence, count, live, redis.call('ZCARD', KEYS[3])}
local held = redis.call('ZRANGEBYSCORE', KEYS[1], string.format('(%d', now), '+inf', 'WITHSCORES')
for i = 1, #held, 2 do
  out[#out + 1] = held[i]
  out[#out + 1] = tonumber(held[i + 1]) - now
end
return out
