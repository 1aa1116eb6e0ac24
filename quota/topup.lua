-- tokenweir top-up: a running stream draws more tokens from every limit its reservation charged.
-- Twin: quota/topup.py:topup (same double arithmetic). All or nothing, like reserve:
-- the grant is the largest g <= want that every enforced (non-shadow) counter still holds;
-- g < 1 charges nothing. Each counter that holds g is charged g (a money counter: the price of
-- g completion tokens), and the record's charge grows by the same, so settle refunds or charges
-- against reservation + top-ups.
-- KEYS[1] reservation record (written by reserve.lua; every key it names shares its hash tag)
-- ARGV: now_us, want (tokens), micro-USD per 1,000 completion tokens (integer)
-- record fields: key -> charged; key#c, key#r bucket burst/rate; key#l window limit;
--   key#u money; key#s shadow
-- returns {status, granted}: status 1 granted, 0 refused (nothing charged), -1 no record
local rec = redis.call('HGETALL', KEYS[1])
if #rec == 0 then return {-1, 0} end
local now = tonumber(ARGV[1])
local want = tonumber(ARGV[2])
local p1k = tonumber(ARGV[3])
local map = {}
for i = 1, #rec, 2 do map[rec[i]] = rec[i + 1] end
local grant = want
local seen = {}
for key, v in pairs(map) do
  if string.sub(key, -2, -2) ~= '#' then
    local avail, tk, ts, used
    local capv = map[key .. '#c']
    if capv then
      local cap = tonumber(capv)
      local rate = tonumber(map[key .. '#r'])
      local st = redis.call('HMGET', key, 'tk', 'ts')
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
      avail = math.floor(tk)
    else
      used = tonumber(redis.call('GET', key) or '0')
      local limv = map[key .. '#l']
      if not limv then
        avail = want
      elseif map[key .. '#u'] then
        if p1k > 0 then avail = math.floor((tonumber(limv) - used) * 1000 / p1k) else avail = want end
      else
        avail = tonumber(limv) - used
      end
    end
    seen[#seen + 1] = {key, avail, tk, ts, used}
    if (not map[key .. '#s']) and avail < grant then grant = avail end
  end
end
if grant < 1 then return {0, 0} end
for _, s in ipairs(seen) do
  local key, avail, tk, ts, used = s[1], s[2], s[3], s[4], s[5]
  if avail >= grant then
    local cost = grant
    if map[key .. '#u'] then cost = math.ceil(grant * p1k / 1000) end
    if tk then
      local cap = tonumber(map[key .. '#c'])
      local rate = tonumber(map[key .. '#r'])
      tk = tk - cost
      redis.call('HSET', key, 'tk', string.format('%.17g', tk), 'ts', string.format('%.17g', ts))
      if rate > 0 then
        redis.call('PEXPIRE', key, string.format('%d', math.ceil((cap - tk) * 1000 / rate) + 60000))
      else
        redis.call('PERSIST', key)
      end
      redis.call('HINCRBY', KEYS[1], key, cost)
    elseif redis.call('EXISTS', key) == 1 then
      redis.call('SET', key, string.format('%d', used + cost), 'KEEPTTL')
      redis.call('HINCRBY', KEYS[1], key, cost)
    end
  end
end
return {1, grant}
