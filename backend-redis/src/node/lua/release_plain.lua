-- RELEASE_PLAIN (the release of a lock the `try` fast path granted, its common case): KEYS lock,
-- fence; ARGV owner, token
-- `release.lua`'s first step alone, with the two keys and two arguments it reads, where
-- `release.lua` takes four and four (every key and argument costs Redis an object and a Lua
-- string per call). It defines none of the shared helpers.
-- Returns 1 when released: the lock key still held this owner's plain form (nobody queued or
-- read since the grant) and the fence its token; 0 when the lease is no longer current (the
-- fence moved on, or the key is gone); -1 when the key is in another form (marked by a waiter,
-- RESERVED), which only `release.lua` may undo: the caller then sends that, one round trip
-- more, only then.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[2] ~= ARGV[2] or not held[1] then
  return 0
end
if held[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return -1
