-- tokenweir reserve: check every limit, charge all of them or none (shadow limits never deny).
-- Twin: ratelimit_service/limiter.py:reserve (same double arithmetic, same order).
-- KEYS[1] reservation record, KEYS[2..] one per limit
-- ARGV: now_us, ttl_ms, has_record, then 6 per limit: kind(b|w) cost limit rate reset_us flags,
--   then (tracing on only) the call's traceparent, kept in the record as '#t' for the settle span
--   flags: 1 = shadow, 2 = settled later (token limit: written into the record),
--          4 = money (a usd limit: settled with the real price; marked key#u in the record)
--   the record also keeps what a top-up (quota/topup.lua) needs: key#l a window's limit,
--   key#s a shadow limit
-- returns {admitted, then per limit: ok, remaining, retry_us}
local now = tonumber(ARGV[1])
local n = #KEYS - 1
local admitted = true
local oks, vals, tss = {}, {}, {}
for i = 1, n do
  local a = 3 + (i - 1) * 6
  local cost = tonumber(ARGV[a + 2])
  local limit = tonumber(ARGV[a + 3])
  local key = KEYS[i + 1]
  local ok
  if ARGV[a + 1] == 'b' then
    local rate = tonumber(ARGV[a + 4])
    local st = redis.call('HMGET', key, 'tk', 'ts')
    local tk, ts
    if st[1] then
      tk = tonumber(st[1])
      ts = tonumber(st[2])
    else
      tk = limit
      ts = now
    end
    if now > ts then
      tk = tk + (now - ts) * rate / 1000000
      ts = now
    end
    if tk > limit then tk = limit end
    ok = tk >= cost
    vals[i] = tk
    tss[i] = ts
  else
    local used = tonumber(redis.call('GET', key) or '0')
    ok = used + cost <= limit
    vals[i] = used
  end
  oks[i] = ok
  if (not ok) and tonumber(ARGV[a + 6]) % 2 == 0 then admitted = false end
end
local out = {admitted and 1 or 0}
local record = KEYS[1]
local wrote = false
for i = 1, n do
  local a = 3 + (i - 1) * 6
  local key = KEYS[i + 1]
  local cost = tonumber(ARGV[a + 2])
  local limit = tonumber(ARGV[a + 3])
  local flags = tonumber(ARGV[a + 6])
  local ok = oks[i]
  local charge = admitted and ok
  local value = vals[i]
  local retry = 0
  if ARGV[a + 1] == 'b' then
    local rate = tonumber(ARGV[a + 4])
    if charge then
      value = value - cost
      redis.call('HSET', key, 'tk', string.format('%.17g', value), 'ts', string.format('%.17g', tss[i]))
      if rate > 0 then
        redis.call('PEXPIRE', key, string.format('%d', math.ceil((limit - value) * 1000 / rate) + 60000))
      else
        redis.call('PERSIST', key)
      end
    end
    if not ok then
      if cost > limit or rate <= 0 then
        retry = -1
      else
        retry = math.ceil((cost - value) * 1000000 / rate)
      end
    end
    out[#out + 1] = ok and 1 or 0
    out[#out + 1] = math.floor(value)
    out[#out + 1] = retry
  else
    local reset = tonumber(ARGV[a + 5])
    if charge then
      value = value + cost
      redis.call('SET', key, string.format('%d', value), 'PXAT', string.format('%d', reset / 1000 + 60000))
    end
    if not ok then
      if cost > limit then retry = -1 else retry = reset - now end
    end
    out[#out + 1] = ok and 1 or 0
    out[#out + 1] = limit - value
    out[#out + 1] = retry
  end
  if charge and ARGV[3] == '1' and flags >= 2 then
    redis.call('HINCRBY', record, key, cost)
    if ARGV[a + 1] == 'b' then
      redis.call('HSET', record, key .. '#c', ARGV[a + 3], key .. '#r', ARGV[a + 4])
    end
    if flags >= 4 then
      redis.call('HSET', record, key .. '#u', '1')
    end
    if ARGV[a + 1] ~= 'b' then
      redis.call('HSET', record, key .. '#l', ARGV[a + 3])
    end
    if flags % 2 == 1 then
      redis.call('HSET', record, key .. '#s', '1')
    end
    wrote = true
  end
end
if wrote then
  local trace = ARGV[4 + 6 * n]
  if trace then redis.call('HSET', record, '#t', trace) end
  redis.call('PEXPIRE', record, ARGV[2])
end
return out
