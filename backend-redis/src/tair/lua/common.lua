-- Shared by the Tair emulation's scripts, after the node's queue helpers (`now_ms`, the FIFO
-- queue's `prune`, `wake_first`, `writer_ahead`, `queue_up`: see `node/lua/queue.lua`).
--
-- One hash per lock name (KEYS[1]):
--   locked   1 while locked (judged together with expire: locked only if expire lies ahead)
--   expire   the expiry timestamp, server time in ms (moved by an extend)
--   proof    the expiry timestamp expireLock returned: the holder's proof for expireUnlock (an
--            extend moves `expire` but keeps the proof)
--   owner    the holder's owner id
--   count    the holder's reentrant count
--   version  the fencing token: bumped by every successful expireLock (and reader entry), or
--            raised to the acquisition's token minimum; never reset
--   busy     '1' whenever the readers or dlock's queue (below) may hold an entry: see `settle`
-- one ZSET of readers (KEYS[2]), scored by each reader's expiry (server ms), and dlock's FIFO
-- queue of waiters (KEYS[3] queue, KEYS[4] alive, KEYS[5] seq), laid out as a lock's queue
-- (entries are the owner id, the client id, and `r` for a reader). Tair's own commands
-- (`plain` mode) neither join nor look at the queue: they keep exclusion and bypass the order.
-- Every decision uses the server's clock, never the client's.

-- Integers as text without exponent (Lua would write large numbers as 1.7e+12).
local function int(n)
  return string.format('%d', n)
end

-- Whether a writer holds the hash at `now`.
local function write_held(h_locked, h_expire, now)
  return h_locked == '1' and tonumber(h_expire or '0') > now
end

-- The `busy` mark lets the uncontended acquire and release (`try_fast.lua`, `lock.lua`'s and
-- `unlock.lua`'s first lines) learn from the hash they read anyway that nobody reads or queues,
-- instead of asking for the two keys. It is sound because every script that adds a reader or a
-- queue entry sets it in the same step (`read.lua`'s enter, `queue_turn`), and only this, which
-- finds both keys gone in the same step, clears it. A mark left standing after both emptied
-- costs only speed: the next acquire takes the full script, which settles it.
local function settle(hash, readers, queue)
  if redis.call('EXISTS', readers, queue) == 0 then
    redis.call('HDEL', hash, 'busy')
  end
end

-- Wakes the head waiter if the hold it may be waiting for is gone: no writer and, for a
-- writer at the head, no live reader.
local function wake_if_free(hash, readers, queue, wakes, now)
  local h = redis.call('HMGET', hash, 'locked', 'expire')
  if write_held(h[1], h[2], now) then
    return
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and (is_reader(head) or redis.call('ZCOUNT', readers, '(' .. int(now), '+inf') == 0) then
    wake_first(queue, wakes)
  end
end

-- An acquire of `entry` in dlock's queue, in mode 'try' (never jumps a live queue) or 'wait' (the
-- turn goes in queue order; anyone else queues): `free` says nothing holds what it asks for, and
-- `first(rank)` whether, at `rank` in the queue (nil: not queued), nobody it must let go first is
-- ahead. Returns whether it is granted now (its entry then leaves the queue) and its place in the
-- queue when it must wait (-1: not queued). Marks `hash` busy when it queues the entry.
local function queue_turn(hash, queue, alive, seq, entry, mode, free, first, now, alive_until,
    wakes)
  if prune(queue, alive, now) > 0 and free then
    wake_first(queue, wakes)
  end
  if mode == 'try' then
    return free and first(nil), -1
  end
  local rank = redis.call('ZRANK', queue, entry)
  if free and first(rank) then
    if rank then
      redis.call('ZREM', queue, entry)
      redis.call('ZREM', alive, entry)
    end
    return true, -1
  end
  if not rank then
    redis.call('HSET', hash, 'busy', '1')
  end
  return false, queue_up(queue, alive, seq, entry, rank, alive_until)
end
