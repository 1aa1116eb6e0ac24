-- tokenweir peek: read-only. The live quota fields of a tenant and the state of every counter
-- that could apply, in one call. KEYS[1] the quota hash, then per quota: its bucket key and its
-- minute, hour, day and month window keys. Returns {fields, then per quota: {tk, ts}, 4 counters}.
local out = {redis.call('HGETALL', KEYS[1])}
for i = 2, #KEYS, 5 do
  out[#out + 1] = redis.call('HMGET', KEYS[i], 'tk', 'ts')
  for j = 1, 4 do
    out[#out + 1] = redis.call('GET', KEYS[i + j])
  end
end
return out
