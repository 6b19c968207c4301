-- TRY (fast path of an exclusive `try` acquire): KEYS lock, fence; ARGV owner, ttl_ms, [token
-- min_token] (absent = none: every argument costs Redis an object and a Lua string per call, so
-- the common call sends two)
-- Returns `<owner>:<token>` when granted (the lock key was absent; one string, the cheapest reply
-- for Redis to build from Lua, where a table reply is several times dearer), {0, fence} when a
-- plain holder holds it (nobody queued or reading; fence: the counter's value, the holder's
-- token; Redlock's acquirer takes a token above every fence it hears of), -1 when the key is
-- marked or RESERVED: someone may be queued or reading (the caller then runs `acquire` in `try`
-- mode, which drops dead waiters and expired readers first and never jumps live ones).
--
-- The lock key exists while anyone waits or reads (see `common.lua`), so a `SET NX` that takes
-- it jumps no one: a grant is two commands, the `SET NX PX` and the token (INCR in the same
-- atomic step, so nobody sees the lock without it), and a refusal two, the `SET NX` and one
-- `MGET`. The token is max(fence + 1, min_token), and the counter moves to it in the same step.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local token = redis.call('INCR', KEYS[2])
  if ARGV[3] and token < tonumber(ARGV[3]) then
    token = tonumber(ARGV[3])
    redis.call('SET', KEYS[2], ARGV[3])
  end
  return ARGV[1] .. ':' .. string.format('%d', token)
end
-- A plain holder is any value but RESERVED (`-`) or a marked one (`+` after the owner id): the
-- rule of `holder_of` and `is_marked` in `common.lua`, written out here so that this script
-- defines none of the shared helpers.
local held = redis.call('MGET', KEYS[1], KEYS[2])
if held[1] and held[1] ~= '-' and string.byte(held[1], 33) ~= 43 then
  return {0, held[2] or 0}
end
return -1
