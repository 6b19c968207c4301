-- ACQUIRE: KEYS lock, fence, queue, alive, seq
--          ARGV owner, ttl_ms, mode ('try' | 'wait' | 'member'), alive_ms, client id,
--               wakes (channel prefix), token floor (0 = none)
-- Returns {1, token, owner} when granted, else {0, pttl_of_holder, owner, rank_in_queue,
-- fence} (fence: the counter's value, the last token handed out; Redlock's acquirer takes a
-- token above every fence it hears of).
--
-- A grant's token is max(fence + 1, floor), and the fence counter moves to it in the same step,
-- so every later token is above the floor too.
--
-- 'try':  grant only if the lock is free and nobody (alive) is queued: never jumps the queue.
-- 'wait': grant if the lock is free and this owner heads the queue (or the queue is empty);
--         otherwise join the queue at the tail if not in it (again, if liveness ran out), and
--         refresh this owner's liveness.
-- 'member': as 'wait', but a free lock goes to any live member of the queue, not only its head,
--         and the member keeps its entry when granted. Redlock waits this way: its nodes may
--         order the same waiters differently, and insisting on each node's head could split
--         the votes for ever. Newcomers still never jump a live queue. The entry stays until the
--         vote is decided: a split vote gives the lock back but keeps the place (`cancel` with
--         keep), and the winner's release removes it (`release`).
--
-- The common case comes first and touches only the lock, the queue's existence and the fence:
-- a free lock with nobody waiting is granted in three commands, whatever the mode.
if redis.call('EXISTS', KEYS[1], KEYS[3]) == 0 then
  local token = redis.call('INCR', KEYS[2])
  if token < tonumber(ARGV[7]) then
    token = tonumber(ARGV[7])
    redis.call('SET', KEYS[2], ARGV[7])
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, token, ARGV[1]}
end
--@common
local lock, fence, queue, alive, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local owner, ttl, mode, alive_ms, wakes = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4]), ARGV[6]
local floor = ARGV[7]
local entry = owner .. ARGV[5]
local now = now_ms()
local pruned = prune(queue, alive, now)
local held = redis.call('EXISTS', lock) == 1
if mode == 'try' then
  if not held and redis.call('ZCARD', queue) == 0 then
    return {1, grant(lock, fence, owner, ttl, floor), owner}
  end
  if pruned > 0 then
    wake_head(lock, queue, wakes)
  end
  return {0, redis.call('PTTL', lock), owner, -1, redis.call('GET', fence) or 0}
end
local rank = redis.call('ZRANK', queue, entry)
if not held and (rank == 0 or (rank and mode == 'member')
    or (not rank and redis.call('ZCARD', queue) == 0)) then
  if rank and mode ~= 'member' then
    redis.call('ZREM', queue, entry)
    redis.call('ZREM', alive, entry)
  end
  return {1, grant(lock, fence, owner, ttl, floor), owner}
end
if not rank then
  redis.call('ZADD', queue, redis.call('INCR', seq), entry)
  rank = redis.call('ZCARD', queue) - 1
end
redis.call('ZADD', alive, now + alive_ms, entry)
if pruned > 0 then
  wake_head(lock, queue, wakes)
end
return {0, redis.call('PTTL', lock), owner, rank, redis.call('GET', fence) or 0}
