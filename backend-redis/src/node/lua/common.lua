-- Shared helpers, prepended to every script that needs them (after `queue.lua`'s).
--
-- Keys of one lock (all carry the same `{prefix:name}` hash tag, so they share a Cluster slot):
--   lock   the exclusive hold, in one of three forms (see `holder_of`):
--          plain:    the holder's owner id (unique per acquisition), PX = the lease's ttl; nobody
--                    has queued or read since the grant, so a release needs no look at the queue
--          marked:   `<owner id>+<deadline ms>`: the lease runs out at the deadline (server
--                    time), and the key itself lives on while any waiter may be live
--          RESERVED: no holder, but waiters or readers may be live
--          so the key exists while anyone waits or reads, and a `SET NX` that succeeds is a grant
--          that jumps no one (`try_fast.lua`)
--   fence  the fencing counter (INCR on every grant, or raised to the grant's token minimum;
--          never deleted)
--   queue  ZSET of waiting entries (owner id + client id), scored by arrival ticket (FIFO order)
--   alive  ZSET of the same entries, scored by the server time (ms) until which each is alive
--   seq    the arrival ticket counter
--   shared ZSET of read (shared) holders of the name's read-write lock: member
--          `<owner id>:<token>`, scored by the server time (ms) at which the hold runs out;
--          members whose score has passed are expired and pruned by the scripts that look
--   (`lock` is the exclusive hold, which is also the write lock: a writer is granted only with
--   no live member in `shared`, a reader only while `lock` does not exist.)
--
-- A counting semaphore of the same name is an object apart: its keys carry the same hash tag
-- with a `:sem:` suffix (see `sem_acquire.lua`), and its queue (queue, alive, seq) has the same
-- shape as a lock's, so `prune` and `wake_first` serve both.

-- The next fencing token of `fence`: INCR, or `min_token` (a decimal string, '0' for none) when
-- that is higher, and the counter moves there with it.
local function next_token(fence, min_token)
  local token = redis.call('INCR', fence)
  if token < tonumber(min_token) then
    token = tonumber(min_token)
    redis.call('SET', fence, min_token)
  end
  return token
end

-- A member of a ZSET of holds (a semaphore's permits, a lock's readers) for `owner`: the next
-- token of `fence` (see `next_token`), and the member `<owner>:<token>` in `holders`, running out
-- at `until_ms` (server ms). The member names the token in decimal, as the client writes it
-- (exact up to 2^53). Returns the token and the member.
local function grant_member(holders, fence, min_token, owner, until_ms)
  local token = next_token(fence, min_token)
  local member = owner .. ':' .. string.format('%d', token)
  redis.call('ZADD', holders, until_ms, member)
  return token, member
end

-- The value of a lock key held by no one while waiters or readers may be live.
local RESERVED = '-'

-- Whether the lock value `v` is a marked one (`+` after the 32 digits of the owner id).
local function is_marked(v)
  return string.byte(v, 33) == 43
end

-- The holder of a lock key whose value is `v` (nil: absent) at server time `now`: its owner id
-- and its lease's deadline (false for a plain holder, whose deadline is the key's own expiry),
-- or nil when no lease holds (absent, RESERVED, or a marked lease whose deadline has passed).
-- Any other value, whoever wrote it, is a plain holder: a key this code does not understand is
-- never taken for a free lock.
local function holder_of(v, now)
  if not v or v == RESERVED then
    return nil
  end
  local deadline = is_marked(v) and tonumber(string.sub(v, 34))
  if not deadline then
    return v, false
  end
  if deadline > now then
    return string.sub(v, 1, 32), deadline
  end
  return nil
end

-- How long the holder of `lock` (as `holder_of` gave `deadline`) has left, in ms.
local function holder_ms(lock, deadline, now)
  if deadline then
    return deadline - now
  end
  return redis.call('PTTL', lock)
end

-- A marked value: `owner`'s lease running out at server time `deadline`.
local function marked(owner, deadline)
  return owner .. '+' .. string.format('%d', deadline)
end

-- Keeps the lock key for at least `ms` more (someone waits or reads until then), writing it as
-- RESERVED if it is absent. Only for a caller that knows no lease holds when the key is absent.
local function keep_for(lock, ms)
  local left = redis.call('PTTL', lock)
  if left == -2 then
    redis.call('SET', lock, RESERVED, 'PX', ms)
  elseif left >= 0 and left < ms then
    redis.call('PEXPIRE', lock, ms)
  end
end

-- Frees the lock key of its holder: deleted when nobody is queued, else left RESERVED with the
-- key's expiry (which already covers every live waiter).
local function vacate(lock, queue)
  if redis.call('EXISTS', queue) == 0 then
    redis.call('DEL', lock)
  else
    redis.call('SET', lock, RESERVED, 'KEEPTTL')
  end
end

-- Takes the lock for `owner` at server time `now`: the next fencing token, then the holder key,
-- plain with the lease's ttl when nobody is queued, else marked, the key kept at least
-- `alive_ms` (every waiter refreshes its liveness to at most that far ahead). Tokens are drawn
-- only here, so while the lock is held the fence counter is its holder's token.
local function grant(lock, fence, queue, owner, ttl, min_token, now, alive_ms)
  local token = next_token(fence, min_token)
  ttl = tonumber(ttl)
  if redis.call('EXISTS', queue) == 0 then
    redis.call('SET', lock, owner, 'PX', ttl)
  else
    redis.call('SET', lock, marked(owner, now + ttl), 'PX', math.max(ttl, alive_ms))
  end
  return token
end

-- If the lock is free at server time `now` and someone waits, tells the head waiter.
local function wake_head(lock, queue, wakes, now)
  if not holder_of(redis.call('GET', lock), now) then
    wake_first(queue, wakes)
  end
end

-- Deletes a RESERVED lock key that nobody needs any more: no live reader in `shared` and nobody
-- queued (so the next `try` is the fast one again).
local function unreserve(lock, queue, shared, now)
  if redis.call('GET', lock) == RESERVED and redis.call('EXISTS', queue) == 0
      and redis.call('ZCOUNT', shared, string.format('(%d', now), '+inf') == 0 then
    redis.call('DEL', lock)
  end
end
