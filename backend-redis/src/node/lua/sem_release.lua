-- SEM_RELEASE: KEYS holders, queue, alive, then for a permit: count, fence, terms; for a reader:
--              the lock
--              ARGV member (`<owner id>:<token>`), wakes (channel prefix), last ('1': the lock's
--              readers, see below)
-- Frees the permit only if it is this lease's and has not run out: the member names both the
-- owner id and the token, so another owner's lease, or an earlier permit of the same owner, frees
-- nothing.
--
-- A permit's release then hands the free permits to the live head waiters in queue order, here,
-- in the same write: each gets the semaphore's next token and a permit member, leaves the queue,
-- and is told `<owner id>:<token>:<tag>` on its client's channel, so it holds without another
-- request (a waiter that misses the message finds its permit on its next attempt:
-- `sem_acquire.lua`, queued). Anyone allowed to PUBLISH can send such a message, so the tag
-- proves it came from here: the SHA-1 of `<secret>:<owner id>:<token>:<secret>`, with the
-- secret the waiter stored in its terms, which no message ever carries. A waiter takes a message
-- whose tag does not check out only as a wake-up (an entry without a secret, from an older
-- client, is told `<owner id>:<token>` alone). Its lease cannot start at this release: the waiter's client does not know when the
-- release ran. It starts where the waiter's own clock can place it, at its last queued attempt:
-- the permit runs out `ttl` after the server time of the waiter's last liveness refresh
-- (`alive` minus the `alive_ms` of its terms), which no earlier than the client sent that
-- attempt. A head whose permit would have less than half its ttl left that way (it stalled,
-- or waited long between refreshes), or without terms, is woken to re-check instead.
--
-- A reader of a read-write lock is released by this script too, on the lock's `shared` ZSET and
-- queue, with last = '1': a writer at the head needs every reader gone, so only the last
-- reader's release wakes it (a reader never waits for readers; no writer holds while a reader
-- does, so the lock is free then). Nothing is handed over there. The last reader's release with
-- nobody queued deletes the RESERVED lock key (see `common.lua`).
-- Returns 1 when released, 0 when the lease was no longer current (an expired member is pruned).
--@common
local holders, queue, alive, wakes = KEYS[1], KEYS[2], KEYS[3], ARGV[2]
local now = now_ms()
local expires = redis.call('ZSCORE', holders, ARGV[1])
if not expires then
  return 0
end
redis.call('ZREM', holders, ARGV[1])
if tonumber(expires) <= now then
  return 0
end
if ARGV[3] == '1' then
  unreserve(KEYS[4], queue, holders, now)
end
if redis.call('EXISTS', queue) == 0 then
  return 1
end
if ARGV[3] == '1' then
  if redis.call('ZCOUNT', holders, string.format('(%d', now), '+inf') == 0 then
    prune(queue, alive, now)
    wake_first(queue, wakes)
  end
  return 1
end

local count, fence, terms = KEYS[4], KEYS[5], KEYS[6]
prune(queue, alive, now, terms)
redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
local free = tonumber(redis.call('GET', count) or '0') - redis.call('ZCARD', holders)
local handed = 0
while free > 0 do
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if not head then
    return 1
  end
  local t = redis.call('HGET', terms, head)
  local alive_until = redis.call('ZSCORE', alive, head)
  if not t or not alive_until then
    break
  end
  local alive_ms, ttl, min_token, secret = string.match(t, '^(%d+) (%d+) (%d+) ?(%x*)$')
  if not alive_ms then
    break
  end
  local until_ms = tonumber(alive_until) - tonumber(alive_ms) + tonumber(ttl)
  if (until_ms - now) * 2 < tonumber(ttl) then
    break
  end
  local _, member = grant_member(holders, fence, min_token, string.sub(head, 1, 32), until_ms)
  redis.call('ZREM', queue, head)
  redis.call('ZREM', alive, head)
  redis.call('HDEL', terms, head)
  if secret ~= '' then
    member = member .. ':' .. redis.sha1hex(secret .. ':' .. member .. ':' .. secret)
  end
  tell(wakes, head, member)
  free = free - 1
  handed = handed + 1
end
if free > 0 or handed == 0 then
  wake_first(queue, wakes)
end
return 1
