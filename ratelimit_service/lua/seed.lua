-- tokenweir seed: copy policy defaults into the live quota hash without overwriting live edits.
-- KEYS[1] live quota hash, KEYS[2] the defaults seeded last time; ARGV field, value, ...
-- A field is (re)written only where it is absent or still holds the previous default; a default
-- that left the policy is removed only where nobody edited it.
local old = {}
local prev = redis.call('HGETALL', KEYS[2])
for i = 1, #prev, 2 do old[prev[i]] = prev[i + 1] end
local new = {}
for i = 1, #ARGV, 2 do new[ARGV[i]] = ARGV[i + 1] end
local written = 0
for f, v in pairs(new) do
  local cur = redis.call('HGET', KEYS[1], f)
  if (not cur) or cur == old[f] then
    if cur ~= v then written = written + 1 end
    redis.call('HSET', KEYS[1], f, v)
  end
end
for f, v in pairs(old) do
  if new[f] == nil and redis.call('HGET', KEYS[1], f) == v then
    redis.call('HDEL', KEYS[1], f)
  end
end
redis.call('DEL', KEYS[2])
if #ARGV > 0 then redis.call('HSET', KEYS[2], unpack(ARGV)) end
return written
