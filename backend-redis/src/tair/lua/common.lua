-- Shared by the Tair emulation's scripts. One hash per lock name (KEYS[1]):
--   locked   1 while locked (judged together with expire: locked only if expire lies ahead)
--   expire   the expiry timestamp, server time in ms (moved by an extend)
--   proof    the expiry timestamp expireLock returned: the holder's proof for expireUnlock (an
--            extend moves `expire` but keeps the proof)
--   owner    the holder's owner id
--   count    the holder's reentrant count
--   version  the fencing token: bumped by every successful expireLock (and reader entry), or
--            raised to the acquisition's token floor; never reset
-- and one ZSET of readers (KEYS[2]), scored by each reader's expiry (server ms).
-- Every decision uses the server's clock, never the client's.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Integers as text without exponent (Lua would write large numbers as 1.7e+12).
local function int(n)
  return string.format('%d', n)
end
