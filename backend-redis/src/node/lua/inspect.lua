-- INSPECT: KEYS lock, fence, queue, alive, shared
-- Returns {holder owner id or '', pttl, last token or -1, live waiters, queued entries, live
-- readers, the oldest live reader's member (`<owner id>:<token>`) or '', its ms left}. While the
-- lock is held the last token is its holder's (tokens are drawn only by a grant). Read-only:
-- expired readers are not reported.
--@common
local now = now_ms()
local v, deadline = holder_of(redis.call('GET', KEYS[1]), now)
local pttl = -2
if v then
  pttl = holder_ms(KEYS[1], deadline, now)
else
  v = ''
end
local fence = tonumber(redis.call('GET', KEYS[2]) or '-1')
local after = string.format('(%d', now)
-- The holder is not a waiter, though a Redlock holder keeps its queue entry until it releases.
local live = 0
for _, w in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], after, '+inf')) do
  if string.sub(w, 1, 32) ~= v then
    live = live + 1
  end
end
-- The reader granted first (the lowest token) among the live ones.
local readers = redis.call('ZRANGEBYSCORE', KEYS[5], after, '+inf', 'WITHSCORES')
local oldest, oldest_token, left = '', nil, 0
for i = 1, #readers, 2 do
  local token = tonumber(string.sub(readers[i], 34))
  if not oldest_token or token < oldest_token then
    oldest, oldest_token, left = readers[i], token, tonumber(readers[i + 1]) - now
  end
end
return {v, pttl, fence, live, redis.call('ZCARD', KEYS[3]), #readers / 2,
  oldest, left}
