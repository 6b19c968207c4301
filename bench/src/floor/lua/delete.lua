-- The raw floor's compare-and-delete (for `dlock bench`): KEYS key; ARGV value.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
