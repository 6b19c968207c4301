-- ACQUIRE: KEYS lock, fence, queue, alive, seq, shared
--          ARGV owner, ttl_ms, mode ('try' | 'wait' | 'member'), alive_ms, client id,
--               wakes (channel prefix), token minimum (0 = none), read ('1': a shared hold of the
--               read-write lock; else the exclusive hold, which is the write lock)
-- Returns {1, token, owner} when granted, else {0, ms_blocked, owner, rank_in_queue, fence}
-- (ms_blocked: how long the holds in the way last unless released: the holder's pttl, for a
-- writer blocked by readers the last reader's, negative when nothing holds; fence: the counter's
-- value, the last token handed out; Redlock's acquirer takes a token above every fence it hears
-- of).
--
-- A grant's token is max(fence + 1, min_token), and the fence counter moves to it in the same step,
-- so every later token is above the minimum too. Readers draw from the same counter.
--
-- The exclusive hold needs the lock free and no live reader; a reader needs the lock free and no
-- writer queued ahead of it, so readers and writers queue together in arrival order and a steady
-- stream of readers never starves a writer.
--
-- 'try':  exclusive: grant only if the lock is free, no reader holds and nobody (alive) is
--         queued: never jumps the queue. Read: grant if the lock is free and no writer is queued.
-- 'wait': exclusive: grant if the lock is free, no reader holds, and this owner heads the queue
--         (or the queue is empty); read: grant if the lock is free and no writer is queued ahead
--         of this owner (or, not queued yet, anywhere in the queue), so a run of readers at the
--         head gets in together (a queued reader granted wakes the next head if it is a reader).
--         Otherwise join the queue at the tail if not in it (again, if liveness ran out), and
--         refresh this owner's liveness. A grant leaves the queue.
-- 'member': (exclusive only) as 'wait', but a free lock goes to any live member of the queue,
--         not only its head, and the member keeps its entry when granted. Redlock waits this
--         way: its nodes may order the same waiters differently, and insisting on each node's
--         head could split the votes for ever. Newcomers still never jump a live queue. The entry
--         stays until the vote is decided: a split vote gives the lock back but keeps the place
--         (`cancel` with keep), and the winner's release removes it (`release`).
--
-- The common case comes first and touches only the lock, the queue's and the readers' existence
-- and the fence: a free exclusive lock with nobody waiting or reading is granted in three
-- commands, whatever the mode.
if ARGV[8] ~= '1' and redis.call('EXISTS', KEYS[1], KEYS[3], KEYS[6]) == 0 then
  local token = redis.call('INCR', KEYS[2])
  if token < tonumber(ARGV[7]) then
    token = tonumber(ARGV[7])
    redis.call('SET', KEYS[2], ARGV[7])
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, token, ARGV[1]}
end
--@common
local lock, fence, queue, alive, seq, shared = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, ttl, mode, alive_ms, wakes = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[6]
local min_token = ARGV[7]
local read = ARGV[8] == '1'
local entry = owner .. ARGV[5]
if read then
  entry = entry .. 'r'
end
local now = now_ms()
-- Dead waiters leave the queue, expired readers the read holds (by the server's clock).
local pruned = prune(queue, alive, now) + redis.call('ZREMRANGEBYSCORE', shared, '-inf', now)
local value = redis.call('GET', lock)
local holder, deadline = holder_of(value, now)
local writer = holder ~= nil
local held = writer or (not read and redis.call('EXISTS', shared) == 1)

-- The grant: the exclusive lock, or a read hold that runs out at now + ttl (the lock key then
-- stays, RESERVED, at least as long, so no `SET NX` takes the lock from under a reader).
local function grant_hold()
  if not read then
    return grant(lock, fence, queue, owner, ttl, min_token, now, alive_ms)
  end
  -- No lease holds here (absent, RESERVED, or a marked lease that ran out).
  redis.call('SET', lock, RESERVED, 'PX', math.max(tonumber(ttl), redis.call('PTTL', lock)))
  return (grant_member(shared, fence, min_token, owner, now + tonumber(ttl)))
end

-- How long the holds in the way last (a head waiter looks again then: expiry publishes nothing).
local function blocked_ms()
  if writer then
    return holder_ms(lock, deadline, now)
  end
  if held then
    local last = redis.call('ZRANGE', shared, -1, -1, 'WITHSCORES')
    return tonumber(last[2]) - now
  end
  return -2
end

-- After pruning, the lock may be free for the head (expiry publishes nothing).
local function wake_if_pruned()
  if pruned > 0 and not writer then
    wake_first(queue, wakes)
  end
end

if mode == 'try' then
  local free
  if read then
    free = not writer and not writer_ahead(queue, nil)
  else
    free = not held and redis.call('ZCARD', queue) == 0
  end
  if free then
    return {1, grant_hold(), owner}
  end
  wake_if_pruned()
  return {0, blocked_ms(), owner, -1, redis.call('GET', fence) or 0}
end
local rank = redis.call('ZRANK', queue, entry)
local turn
if read then
  turn = not writer and not writer_ahead(queue, rank)
else
  turn = not held and (rank == 0 or (rank and mode == 'member')
    or (not rank and redis.call('ZCARD', queue) == 0))
end
if turn then
  if rank and mode ~= 'member' then
    redis.call('ZREM', queue, entry)
    redis.call('ZREM', alive, entry)
  end
  local token = grant_hold()
  if read then
    -- A run of readers goes in together: the next head, if a reader, may come in too.
    local head = redis.call('ZRANGE', queue, 0, 0)[1]
    if head and is_reader(head) then
      wake_first(queue, wakes)
    end
  end
  return {1, token, owner}
end
rank = queue_up(queue, alive, seq, entry, rank, now + alive_ms)
-- Someone waits now: a plain holder becomes marked (its release must look at the queue), and the
-- lock key stays at least as long as this waiter is live. A value this code did not write (not
-- an owner id with an expiry) is left exactly as it is.
if writer and not deadline then
  local left = redis.call('PTTL', lock)
  if #holder == 32 and left > 0 then
    redis.call('SET', lock, marked(holder, now + left), 'PX', math.max(left, alive_ms))
  end
else
  keep_for(lock, alive_ms)
end
wake_if_pruned()
return {0, blocked_ms(), owner, rank, redis.call('GET', fence) or 0}
