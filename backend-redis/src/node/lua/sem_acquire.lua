-- SEM_ACQUIRE: KEYS holders, fence, queue, alive, seq, count, terms (the semaphore's keys)
--              ARGV owner, ttl_ms, mode ('try' | 'wait'), alive_ms, client id, wakes (channel
--                   prefix), token minimum (0 = none), permits, queued ('1': an earlier attempt
--                   of this owner was answered with a place in the queue), secret (the
--                   waiter's, 32 hex digits: see `sem_release.lua`; empty for a try)
-- Returns {1, token, owner} when a permit is granted now; {2, token, owner} when a release
-- handed this queued owner a permit before this attempt ran (its lease runs from the owner's
-- last queued attempt, not from this one: see `sem_release.lua`); {0, ms until the earliest
-- permit runs out (-1 when one is free), owner, rank_in_queue (-1 for a try), fence} when not;
-- {-1, recorded count, owner} when the semaphore is in use with another count than `permits`
-- (nothing changed).
--
-- A semaphore is an object apart from the lock of the same name: its keys carry the lock's hash
-- tag (one Cluster slot) with their own suffixes, `{p:n}:sem:holders` and so on.
--   holders ZSET of permits: member `<owner id>:<token>`, scored by the server time (ms) at which
--           the permit runs out; members whose score has passed are expired and pruned here
--   fence   the semaphore's own fencing counter (INCR on every grant, never deleted but by forget)
--   queue, alive, seq  the FIFO queue of waiters, as a lock's (see common.lua)
--   count   the count recorded while the semaphore is in use (a live holder or a queued waiter);
--           once nobody holds or waits, the next caller's count becomes the semaphore's
--   terms   HASH from each queue entry to `<alive_ms> <ttl_ms> <token minimum> <secret>`, its
--           terms as it joined the queue: what a release needs to grant the entry a permit in
--           its place, and to tag the message that tells it so
--
-- 'try':  grant if fewer than `permits` permits are live and nobody (alive) is queued: a try
--         never jumps the queue.
-- 'wait': grant if fewer than `permits` permits are live and this owner heads the queue (or the
--         queue is empty and it is not in it); otherwise join the queue at the tail if not in it
--         (again, if its liveness ran out) and refresh its liveness. A queued waiter granted while
--         permits remain wakes the next head, so consecutive waiters get in together. A queued
--         owner no longer in the queue may have been handed a permit by a release: its live
--         permit is looked for among the holders first (only then: the look costs a pass over
--         the holders).
--@common
local holders, fence, queue, alive, seq, count = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local terms = KEYS[7]
local owner, ttl, mode, alive_ms, wakes = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[6]
local min_token, permits = ARGV[7], tonumber(ARGV[8])
local entry = owner .. ARGV[5]
local now = now_ms()
-- Expired permits free themselves here (by the server's clock), dead waiters leave the queue.
local pruned = redis.call('ZREMRANGEBYSCORE', holders, '-inf', now) + prune(queue, alive, now, terms)
local live = redis.call('ZCARD', holders)
local queued = redis.call('ZCARD', queue)
local recorded = tonumber(redis.call('GET', count) or '0')
if live > 0 or queued > 0 then
  if recorded ~= permits and recorded > 0 then
    return {-1, recorded, owner}
  end
end
if recorded ~= permits then
  redis.call('SET', count, ARGV[8])
end
local free = live < permits

-- A permit for `owner`: the semaphore's next token, and a member that runs out at now + ttl.
local function grant_permit()
  return (grant_member(holders, fence, min_token, owner, now + ttl))
end

-- Until the earliest live permit runs out, when none is free (a head waiter looks again then:
-- expiry publishes nothing).
local function blocked_ms()
  if free then
    return -1
  end
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) - now
end

if mode == 'try' then
  if free and queued == 0 then
    return {1, grant_permit(), owner}
  end
  if pruned > 0 and free then
    wake_first(queue, wakes)
  end
  return {0, blocked_ms(), owner, -1, redis.call('GET', fence) or 0}
end
local rank = redis.call('ZRANK', queue, entry)
if not rank and ARGV[9] == '1' then
  local mine = owner .. ':'
  for _, member in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    if string.sub(member, 1, 33) == mine then
      return {2, tonumber(string.sub(member, 34)), owner}
    end
  end
end
if free and (rank == 0 or (not rank and queued == 0)) then
  if rank then
    redis.call('ZREM', queue, entry)
    redis.call('ZREM', alive, entry)
    redis.call('HDEL', terms, entry)
  end
  local token = grant_permit()
  if live + 1 < permits then
    wake_first(queue, wakes)
  end
  return {1, token, owner}
end
if not rank then
  redis.call('HSET', terms, entry, ARGV[4] .. ' ' .. ARGV[2] .. ' ' .. min_token .. ' ' .. ARGV[10])
end
rank = queue_up(queue, alive, seq, entry, rank, now + alive_ms)
if pruned > 0 and free then
  wake_first(queue, wakes)
end
return {0, blocked_ms(), owner, rank, redis.call('GET', fence) or 0}
