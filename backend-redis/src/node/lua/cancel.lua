-- CANCEL: KEYS lock, queue, alive, fence, shared; ARGV owner, client id, wakes (channel prefix),
--         keep (1 = keep the queue entry), spare (a token, or 0 for none), read ('1': the undo
--         of a reader's acquire)
-- Undoes an acquire whose caller went away: leaves the queue, and deletes the lock (for a reader,
-- every read hold of this owner id in `shared`: the caller never saw its token, and an owner id
-- names one acquisition) if it was granted to this owner meanwhile. Then wakes the next head if
-- the lock is free. With keep, only the lock is given back: a Redlock waiter that lost a split
-- vote stays where it was queued. With spare, a grant whose token (the fence counter) is spare
-- stays: a Redlock vote was won with that token, so this late grant is part of the winner's
-- lease, and an extend may already have counted it.
-- Returns 1 if a lock (or read hold) granted to the owner was deleted, else 0.
--@common
local owner = ARGV[1]
local now = now_ms()
local read = ARGV[6] == '1'
local entry = owner .. ARGV[2]
if read then
  entry = entry .. 'r'
end
local removed = 0
if ARGV[4] ~= '1' then
  removed = redis.call('ZREM', KEYS[2], entry)
  redis.call('ZREM', KEYS[3], entry)
end
local released = 0
if read then
  for _, member in ipairs(redis.call('ZRANGE', KEYS[5], 0, -1)) do
    if string.sub(member, 1, 32) == owner then
      redis.call('ZREM', KEYS[5], member)
      released = 1
    end
  end
  unreserve(KEYS[1], KEYS[2], KEYS[5], now)
elseif holder_of(redis.call('GET', KEYS[1]), now) == owner
    and (ARGV[5] == '0' or redis.call('GET', KEYS[4]) ~= ARGV[5]) then
  vacate(KEYS[1], KEYS[2])
  released = 1
end
if removed == 1 or released == 1 then
  wake_head(KEYS[1], KEYS[2], ARGV[3], now)
end
return released
