-- The FIFO queue's helpers, shared by every script that queues or wakes: the node's own scripts
-- (pasted before `common.lua`, which builds on them) and the Tair emulation's (before its own
-- `common.lua`). Kept apart so that a Tair script defines only these: Redis creates every
-- helper a script defines on each call, and the lock key's helpers are no use to Tair.
--
-- The queue's keys (`queue`, `alive`, `seq`) are laid out as `common.lua` describes.

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
