-- EXPIRE_LOCK: KEYS hash, readers, queue, alive, seq
--              ARGV owner, ttl_ms, reentrant (1|0), waiting_ms (0 = not a waiting writer),
--                   token minimum (0 = none), mode ('plain' | 'try' | 'wait'), alive_ms,
--                   client id, wakes (channel prefix)
-- Locks only in the unlocked state (flag clear, or expiry passed) and when no reader holds the
-- key; an expired lock is taken over in the same step. The new expiry is above the old one even
-- within the same millisecond, so a stale proof never equals a newer holder's.
-- With reentrant = 1, the holder locking again counts up and keeps its proof.
-- mode 'plain' is Tair's expireLock: the queue plays no part. 'try' (dlock's single attempt)
-- also refuses while anyone live is queued; 'wait' grants only to the queue's head (or with the
-- queue empty and this owner not in it), and otherwise puts the owner at the tail (or keeps its
-- place) and refreshes its liveness: FIFO, as a redis:// lock's queue.
-- A waiting writer (waiting_ms > 0) that is refused marks the hash `writer waiting` until now +
-- waiting_ms: readers that bypass the queue (Tair's own) stay out meanwhile, so a stream of
-- them cannot starve it. Its own lock clears the mark.
-- A fresh lock's version is max(version + 1, min_token), set in the same step.
-- Returns {1, proof, version, count} when locked (the proof is the expiry this lock set), else
-- {0, expiry, holder, rank, ms_blocked}: holder 'readers' when readers hold it, '' when only the
-- queue is ahead; rank the owner's place in the queue (-1: not queued); ms_blocked how long the
-- holds in the way last unless released (-1: none, only the queue).
--
-- The uncontended lock comes first, before the prelude (Redis makes every helper of the prelude
-- anew on each call): nobody reads or queues (the hash is not marked `busy`, so the queue and
-- the readers have nothing to say in any mode), no writer holds, and this owner left no mark
-- of its own to clear. Then the grant is one write of the hash, the version max(version + 1,
-- min_token) computed from the same read, with what the full path below would return.
do
  local t = redis.call('TIME')
  local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local f = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'version', 'wwait', 'busy')
  local was = tonumber(f[2] or '0')
  if not f[5] and not (f[1] == '1' and was > at) and f[4] ~= ARGV[1] then
    local proof = string.format('%d', math.max(at + tonumber(ARGV[2]), was + 1))
    local v = math.max(tonumber(f[3] or '0') + 1, tonumber(ARGV[5]))
    redis.call('HSET', KEYS[1], 'locked', '1', 'expire', proof, 'proof', proof, 'owner', ARGV[1],
      'count', '1', 'version', string.format('%d', v))
    return {1, proof, v, 1}
  end
end
--@tair
local hash, readers, queue, alive, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, mode = ARGV[1], ARGV[6] or 'plain'
local now = now_ms()
local h = redis.call('HMGET', hash, 'locked', 'expire', 'owner', 'version', 'proof')
local expire = tonumber(h[2] or '0')
local held = write_held(h[1], h[2], now)
if held and ARGV[3] == '1' and h[3] == owner then
  local count = redis.call('HINCRBY', hash, 'count', 1)
  return {1, h[5], tonumber(h[4]), count}
end
local function wait_mark()
  if tonumber(ARGV[4] or '0') > 0 then
    redis.call('HSET', hash, 'wwait', owner, 'wwait_until', int(now + tonumber(ARGV[4])))
  end
end
-- The holds in the way: the writer, or the live readers (the last one's expiry).
local holder, blocked = '', -1
if held then
  holder, blocked = h[3], expire - now
else
  redis.call('ZREMRANGEBYSCORE', readers, '-inf', int(now))
  local last = redis.call('ZREVRANGEBYSCORE', readers, '+inf', '(' .. int(now), 'WITHSCORES', 'LIMIT', 0, 1)
  if last[2] then
    holder, blocked = 'readers', tonumber(last[2]) - now
  end
end
local rank = -1
local turn = blocked < 0
-- A try with nobody queued (the uncontended case) needs no more than that.
if mode == 'wait' or (mode == 'try' and redis.call('EXISTS', queue) == 1) then
  -- A writer goes first at the head, or into an empty queue.
  local function first(r)
    return r == 0 or (not r and redis.call('ZCARD', queue) == 0)
  end
  turn, rank = queue_turn(hash, queue, alive, seq, owner .. ARGV[8], mode, turn, first, now,
    now + tonumber(ARGV[7]), ARGV[9])
end
if not turn then
  wait_mark()
  if blocked < 0 then
    return {0, int(expire), '', rank, -1}
  end
  return {0, int(held and expire or now + blocked), holder, rank, blocked}
end
if redis.call('HGET', hash, 'wwait') == owner then
  redis.call('HDEL', hash, 'wwait', 'wwait_until')
end
settle(hash, readers, queue)
local new_expire = math.max(now + tonumber(ARGV[2]), expire + 1)
local version = redis.call('HINCRBY', hash, 'version', 1)
if version < tonumber(ARGV[5]) then
  version = tonumber(ARGV[5])
  redis.call('HSET', hash, 'version', ARGV[5])
end
redis.call('HSET', hash, 'locked', '1', 'expire', int(new_expire), 'proof', int(new_expire),
  'owner', owner, 'count', '1')
return {1, int(new_expire), version, 1}
