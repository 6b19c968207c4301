-- READ: KEYS hash, readers, queue, alive, seq
--       ARGV reader id, ttl_ms, op ('enter' | 'exit' | 'renew' | 'unwait' | 'leave'), token minimum
--            (0 = none; used by enter), mode ('plain' | 'try' | 'wait'; for enter), alive_ms,
--            client id, wakes (channel prefix)
-- enter: in one step, refuses while a writer holds the lock, else adds the reader with its
--        expiry (readers whose expiry passed are dropped first). The writer's expireLock checks
--        the readers in one step too, so a reader and a writer can never both get in.
--        mode 'plain' (Tair's own readers) also stays out while a writer waits (its mark) and
--        ignores the queue; 'try' also refuses while a writer is queued; 'wait' enters when no
--        writer is queued ahead of this reader (so the readers at the head get in together: an
--        entered reader wakes the next head if it is a reader too), else queues the reader as a
--        writer's 'wait' does.
-- exit:  removes the reader; the last one out wakes the head of the queue. renew: moves a present
--        reader's expiry. unwait: clears the `writer waiting` mark of the writer ARGV[1] (it gave
--        up). leave: takes ARGV[1]'s entries (writer and reader) out of the queue and wakes the
--        head if it may go now (the undo of a waiting acquire).
-- Returns for enter {1, expiry, version} (the version bumped, to at least the minimum: the
-- reader's fencing token) or {0, writer's expiry, writer, rank, ms_blocked} (as expireLock's);
-- for exit, renew, unwait and leave 1 when there was something to change, else 0.
--@tair
local hash, readers, queue, alive, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local reader, op, mode, wakes = ARGV[1], ARGV[3], ARGV[5] or 'plain', ARGV[8]
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', readers, '-inf', int(now))
if op == 'exit' then
  local gone = redis.call('ZREM', readers, reader)
  if gone == 1 and redis.call('ZCARD', readers) == 0 then
    if redis.call('EXISTS', queue) == 1 then
      prune(queue, alive, now)
      wake_if_free(hash, readers, queue, wakes, now)
    end
    settle(hash, readers, queue)
  end
  return gone
end
if op == 'unwait' then
  -- A waiting writer (ARGV[1]) gives up: its mark goes, if it is still its own.
  if redis.call('HGET', hash, 'wwait') == reader then
    return redis.call('HDEL', hash, 'wwait', 'wwait_until') > 0 and 1 or 0
  end
  return 0
end
if op == 'leave' then
  local entry = reader .. ARGV[7]
  local gone = redis.call('ZREM', queue, entry, entry .. 'r')
  redis.call('ZREM', alive, entry, entry .. 'r')
  if gone > 0 then
    wake_if_free(hash, readers, queue, wakes, now)
    settle(hash, readers, queue)
  end
  return gone > 0 and 1 or 0
end
local expiry = now + tonumber(ARGV[2])
if op == 'renew' then
  if redis.call('ZSCORE', readers, reader) then
    redis.call('ZADD', readers, int(expiry), reader)
    return 1
  end
  return 0
end
local h = redis.call('HMGET', hash, 'locked', 'expire', 'owner', 'version', 'wwait', 'wwait_until')
local writer = write_held(h[1], h[2], now)
local rank = -1
local turn = not writer
if mode == 'plain' then
  if turn and h[5] and tonumber(h[6] or '0') > now then
    return {0, h[6], h[5], -1, tonumber(h[6]) - now}
  end
elseif mode == 'wait' or redis.call('EXISTS', queue) == 1 then
  -- A reader goes with no writer queued ahead of it (readers at the head go together).
  local function first(r)
    return not writer_ahead(queue, r)
  end
  turn, rank = queue_turn(hash, queue, alive, seq, reader .. ARGV[7] .. 'r', mode, turn, first, now,
    now + tonumber(ARGV[6]), wakes)
end
if not turn then
  if writer then
    return {0, h[2], h[3], rank, tonumber(h[2]) - now}
  end
  return {0, '0', '', rank, -1}
end
redis.call('ZADD', readers, int(expiry), reader)
redis.call('HSET', hash, 'busy', '1')
-- Every hold gets a token above every earlier one, a reader's too.
local version = redis.call('HINCRBY', hash, 'version', 1)
if version < tonumber(ARGV[4]) then
  version = tonumber(ARGV[4])
  redis.call('HSET', hash, 'version', ARGV[4])
end
if mode == 'wait' then
  -- The readers at the head go in together: the next head, if a reader, may come in too.
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head and is_reader(head) then
    wake_first(queue, wakes)
  end
end
return {1, int(expiry), version}
