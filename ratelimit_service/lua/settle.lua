-- tokenweir settle: refund or charge the difference between the real cost and what was reserved.
-- Twin: ratelimit_service/limiter.py:settle. Idempotent: the record is deleted on first use.
-- KEYS[1] reservation record (all keys it names share its hash tag)
-- ARGV: now_us, actual tokens, actual micro-USD (usd limits, marked key#u, settle with it)
-- returns {found, actual - reserved, traceparent stored at reserve or nil} (reserved: the largest
-- token charge in the record; fields whose second-last character is '#' are not counters)
local rec = redis.call('HGETALL', KEYS[1])
if #rec == 0 then return {0, 0} end
redis.call('DEL', KEYS[1])
local now = tonumber(ARGV[1])
local actual = tonumber(ARGV[2])
local actual_usd = tonumber(ARGV[3] or '0')
local map = {}
for i = 1, #rec, 2 do map[rec[i]] = rec[i + 1] end
local reserved = 0
for key, v in pairs(map) do
  if string.sub(key, -2, -2) ~= '#' then
    local delta
    if map[key .. '#u'] then
      delta = actual_usd - tonumber(v)
    else
      delta = actual - tonumber(v)
      if tonumber(v) > reserved then reserved = tonumber(v) end
    end
    local capv = map[key .. '#c']
    if capv then
      local cap = tonumber(capv)
      local rate = tonumber(map[key .. '#r'])
      local st = redis.call('HMGET', key, 'tk', 'ts')
      local tk, ts
      if st[1] then
        tk = tonumber(st[1])
        ts = tonumber(st[2])
      else
        tk = cap
        ts = now
      end
      if now > ts then
        tk = tk + (now - ts) * rate / 1000000
        ts = now
      end
      if tk > cap then tk = cap end
      tk = tk - delta
      if tk > cap then tk = cap end
      redis.call('HSET', key, 'tk', string.format('%.17g', tk), 'ts', string.format('%.17g', ts))
      if rate > 0 then
        redis.call('PEXPIRE', key, string.format('%d', math.ceil((cap - tk) * 1000 / rate) + 60000))
      else
        redis.call('PERSIST', key)
      end
    else
      local used = redis.call('GET', key)
      if used then
        used = tonumber(used) + delta
        if used < 0 then used = 0 end
        redis.call('SET', key, string.format('%d', used), 'KEEPTTL')
      end
    end
  end
end
return {1, actual - reserved, map['#t'] or false}
