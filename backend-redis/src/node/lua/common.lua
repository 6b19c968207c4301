-- Shared helpers, prepended to every script that needs them.
--
-- Keys of one lock (all carry the same `{prefix:name}` hash tag, so they share a Cluster slot):
--   lock   the holder's owner id (unique per acquisition), with PX = the lease ttl
--   fence  the fencing counter (INCR on every grant, or raised to the grant's token floor;
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

-- The server's clock in milliseconds (scripts replicate by effects, so TIME is allowed).
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Removes waiters whose liveness ran out (crashed or stalled clients), and their fields of the
-- hash `terms` when one is given (a semaphore's: see `sem_acquire.lua`); returns how many.
local function prune(queue, alive, now, terms)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now, 'LIMIT', 0, 100)
  for _, w in ipairs(dead) do
    redis.call('ZREM', queue, w)
    redis.call('ZREM', alive, w)
    if terms then
      redis.call('HDEL', terms, w)
    end
  end
  return #dead
end

-- Queue entries (the members of queue and alive) are the waiter's owner id (32 hex digits)
-- followed by the id of its client (16 hex digits), and `r` for a reader of a read-write lock.
-- Each client listens on a channel of its own, `wakes` followed by its id, so a wake-up reaches
-- the head waiter's client only. A `wakes` that starts with a brace is the lock's hash tag
-- (`{<prefix>:<name>}:wake:`, a Redis 7 Cluster): the channel is a shard channel in this
-- script's slot, published with SPUBLISH, so the message stays on this node instead of crossing
-- the cluster bus. Prefixes never hold a brace, so a plain `wakes` never starts with one.
--
-- Sends `payload` to the client of the queue entry `entry`, on its own channel.
local function tell(wakes, entry, payload)
  local publish = 'PUBLISH'
  if string.byte(wakes, 1) == 123 then
    publish = 'SPUBLISH'
  end
  redis.call(publish, wakes .. string.sub(entry, 33, 48), payload)
end

-- If someone waits, tells the head waiter to re-check (the payload is its owner id).
local function wake_first(queue, wakes)
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    tell(wakes, head, string.sub(head, 1, 32))
  end
end

-- If the lock is free and someone waits, tells the head waiter.
local function wake_head(lock, queue, wakes)
  if redis.call('EXISTS', lock) == 0 then
    wake_first(queue, wakes)
  end
end

-- The next fencing token of `fence`: INCR, or `floor` (a decimal string, '0' for none) when
-- that is higher, and the counter moves there with it.
local function next_token(fence, floor)
  local token = redis.call('INCR', fence)
  if token < tonumber(floor) then
    token = tonumber(floor)
    redis.call('SET', fence, floor)
  end
  return token
end

-- A member of a ZSET of holds (a semaphore's permits, a lock's readers) for `owner`: the next
-- token of `fence` (see `next_token`), and the member `<owner>:<token>` in `holders`, running out
-- at `until_ms` (server ms). The member names the token in decimal, as the client writes it
-- (exact up to 2^53). Returns the token and the member.
local function grant_member(holders, fence, floor, owner, until_ms)
  local token = next_token(fence, floor)
  local member = owner .. ':' .. string.format('%d', token)
  redis.call('ZADD', holders, until_ms, member)
  return token, member
end

-- Takes the lock for `owner`: the next fencing token, then the holder key with its ttl. Tokens
-- are drawn only here, so while the lock is held the fence counter is its holder's token.
local function grant(lock, fence, owner, ttl, floor)
  local token = next_token(fence, floor)
  redis.call('SET', lock, owner, 'PX', ttl)
  return token
end

-- Whether a queue entry is a reader's (see the entries above).
local function is_reader(entry)
  return string.sub(entry, 49) == 'r'
end

-- Whether a writer's entry is queued before rank `rank` (nil: anywhere in the queue).
local function writer_ahead(queue, rank)
  if rank == 0 then
    return false
  end
  for _, e in ipairs(redis.call('ZRANGE', queue, 0, rank and rank - 1 or -1)) do
    if not is_reader(e) then
      return true
    end
  end
  return false
end

-- Puts `entry` (at `rank`, nil when not queued) at the tail of the queue if it is not in it,
-- and makes it live until `alive_until` (server ms). Returns its rank.
local function queue_up(queue, alive, seq, entry, rank, alive_until)
  if not rank then
    redis.call('ZADD', queue, redis.call('INCR', seq), entry)
    rank = redis.call('ZCARD', queue) - 1
  end
  redis.call('ZADD', alive, alive_until, entry)
  return rank
end
