-- TRY_FAST (dlock's single attempt at the write lock, its common case): KEYS hash;
--           ARGV owner, ttl_ms, [token minimum] (absent = none)
-- `lock.lua` in mode 'try' (not reentrant, no waiting mark) for the case that needs no queue:
-- with the one key and two or three arguments that case reads, where `lock.lua` takes five
-- and nine, each of which Redis makes into a string on every call. The hash's `busy` mark
-- (`common.lua`) says whether anyone may read or queue, so the readers and the queue are not
-- asked. It defines none of the prelude. Numbers it writes go to Redis as strings: Lua's own
-- number-to-text conversion (a `%.14g` printf) costs more than the rest of a field's write.
-- Returns, as `lock.lua` would:
--   {1, proof, version, 1} when locked: nobody reads or queues (no `busy` mark), no writer
--     holds, and this owner left no `writer waiting` mark of its own; the grant is one write of
--     the hash, the version max(version + 1, min_token) computed from the same read;
--   {0, expiry, holder, -1, ms_blocked} when a writer holds it and nobody reads or queues;
-- and -1 when the hash is marked busy, or this owner's `writer waiting` mark stands: the caller
-- then runs `lock.lua`, which prunes the queue, drops expired readers and clears both marks
-- where they no longer hold.
local t = redis.call('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local f = redis.call('HMGET', KEYS[1], 'locked', 'expire', 'version', 'wwait', 'owner', 'busy')
if f[6] or f[4] == ARGV[1] then
  return -1
end
local was = tonumber(f[2] or '0')
if f[1] == '1' and was > at then
  return {0, string.format('%d', was), f[5] or '', -1, was - at}
end
local proof = string.format('%d', math.max(at + tonumber(ARGV[2]), was + 1))
local v = tonumber(f[3] or '0') + 1
if ARGV[3] then
  v = math.max(v, tonumber(ARGV[3]))
end
redis.call('HSET', KEYS[1], 'locked', '1', 'expire', proof, 'proof', proof, 'owner', ARGV[1],
  'count', '1', 'version', string.format('%d', v))
return {1, proof, v, 1}
