-- tokenweir usage meter: Envoy's Lua HTTP filter on LLM routes whose plugins list `usage`.
-- Rendered by controlplane/translate/usage_meter.py; docs/operations.md "Usage metering".
--
-- The filter server sets, at the request body, namespace `tokenweir`: meter (true), prompt
-- (estimated prompt tokens), max_tokens, stream, cut (drop the usage-only event), reserve,
-- json_max, and the model's prices (price_prompt, price_cached, price_completion: USD per
-- 1k tokens). On the response this script, chunk by chunk and never holding a chunk back:
--   * keeps settle_tokens / settle_usd_micros truthful (prompt + one token per SSE event,
--     at most max_tokens; the usage the backend reports replaces the estimate; a JSON answer
--     is read at its end; an error answer keeps the 0 set at the request);
--   * cuts the usage-only event when the client did not ask for usage;
--   * keeps a summary for the metrics, `timing` = "chunks,first_us,last_us,gap_sum_us,b1..b12"
--     (chunk gaps counted in the buckets of filters/metrics.py _GAP, the last one +Inf), and
--     `outcome`; the filter server reads it from the gRPC access log entry at stream end.
local TW = "tokenweir"
local GAP = {__GAP__} -- upper bounds in microseconds (filters/metrics.py _GAP)
local NGAP = #GAP
local MAX_TAIL = 65536
local find, sub, match, format = string.find, string.sub, string.match, string.format

function envoy_on_request(h)
  h:streamInfo():dynamicMetadata():set(TW, "t0_us", tonumber(h:timestampString(EnvoyTimestampResolution.MICROSECOND)))
end

local function count_events(s)
  local n, i = 0, 1
  while true do
    local j = find(s, "data:", i, true)
    if j == nil then break end
    n, i = n + 1, j + 5
  end
  if n == 0 then return 0 end
  i = 1
  while true do
    local j = find(s, "[DONE]", i, true)
    if j == nil then break end
    n, i = n - 1, j + 6
  end
  return n
end

local function num(s, key)
  local v = match(s, '"' .. key .. '"%s*:%s*(%d+)')
  if v == nil then return 0 end
  return tonumber(v)
end

-- token counts from an OpenAI usage object (with completion_tokens, or an embeddings answer's
-- with total_tokens and no completion) or an SGLang meta_info
local function usage_of(s)
  for _, key in ipairs({'"usage"%s*:%s*{', '"meta_info"%s*:%s*{'}) do
    local at = find(s, key)
    if at ~= nil then
      local u = sub(s, at)
      if find(u, '"completion_tokens"%s*:') ~= nil or find(u, '"total_tokens"%s*:') ~= nil then
        return num(u, "prompt_tokens"), num(u, "completion_tokens"), num(u, "cached_tokens")
      end
    end
  end
  return nil
end

-- quota/cost.py cost_usd and micro_usd: the same operations in the same order
local function money(tw, p, c, k)
  local pp = tw.price_prompt
  if pp == nil then return 0, 0 end
  if k > p then k = p end
  local usd = ((p - k) * pp + k * tw.price_cached + c * tw.price_completion) / 1000
  return usd, math.ceil(usd * 1000000 - 1e-6)
end

local function is_usage_only(ev)
  if find(ev, '"usage"%s*:%s*{') == nil then return false end
  local at = find(ev, '"choices"%s*:')
  return at == nil or find(ev, '^"choices"%s*:%s*%[%s*%]', at) ~= nil
    or find(ev, '"choices"%s*:%s*null') ~= nil
end

-- complete events (each with its blank line) and the incomplete tail
local function split_events(data)
  if find(data, "\r", 1, true) ~= nil then data = data:gsub("\r\n", "\n") end
  local events, i = {}, 1
  while true do
    local j = find(data, "\n\n", i, true)
    if j == nil then break end
    events[#events + 1] = sub(data, i, j + 1)
    i = j + 2
  end
  return events, sub(data, i)
end

local function set_usage(md, tw, p, c, k)
  local usd, micros = money(tw, p, c, k)
  md:set(TW, "settle_tokens", p + c)
  md:set(TW, "settle_usd_micros", format("%d", micros))
  md:set(TW, "prompt_tokens", p)
  md:set(TW, "completion_tokens", c)
  md:set(TW, "cached_tokens", k)
  md:set(TW, "cost_usd", usd)
end

local function is_error(head)
  return find(head, "^%s*[{%[]") == nil or find(head, '"error"', 1, true) ~= nil
end

function envoy_on_response(h)
  local md = h:streamInfo():dynamicMetadata()
  local tw = md:get(TW)
  if tw == nil or tw.meter ~= true then return end
  local headers = h:headers()
  local ok_status = (tonumber(headers:get(":status")) or 200) < 400
  local event_stream = find(headers:get("content-type") or "", "event-stream", 1, true) ~= nil
  local prompt, maxt = tw.prompt or 0, tw.max_tokens or 0
  local cut, json_max = tw.cut == true, tw.json_max or 8388608
  local t0 = tw.t0_us or 0
  local chunks, first, last, gapsum, events, total = 0, 0, 0, 0, 0, -1
  local b = {}
  for i = 1, NGAP + 1 do b[i] = 0 end
  local sse, tail, body, size, too_big = nil, "", {}, 0, false
  for chunk in h:bodyChunks() do
    local n = chunk:length()
    if n > 0 then
      md = h:streamInfo():dynamicMetadata() -- a wrapper lives only until the next yield
      local now = tonumber(h:timestampString(EnvoyTimestampResolution.MICROSECOND))
      local s = chunk:getBytes(0, n)
      if chunks == 0 then
        first = now
        -- an error answer is JSON even when a stream was asked for
        sse = ok_status and (event_stream or find(s, "^%s*data:") ~= nil
          or find(s, "^%s*:") ~= nil or find(s, "^%s*event:") ~= nil)
        md:set(TW, "ttft_ms", math.floor((now - t0) / 100 + 0.5) / 10)
        if sse then md:set(TW, "outcome", "ok") end
      else
        local gap = now - last
        local i = 1
        while i <= NGAP and gap > GAP[i] do i = i + 1 end
        b[i] = b[i] + 1
        gapsum = gapsum + gap
      end
      last, chunks = now, chunks + 1
      if sse then
        if tail ~= "" or find(s, '"usage"', 1, true) ~= nil or find(s, "meta_info", 1, true) ~= nil
          or sub(s, -2) ~= "\n\n" then
          local evs, rest = split_events(tail .. s)
          if cut and #rest > MAX_TAIL then evs[#evs + 1] = rest; rest = "" end
          local kept, dropped = {}, false
          for _, ev in ipairs(evs) do
            local p, c, k = usage_of(ev)
            if p ~= nil then
              if p + c > total then
                total = p + c
                set_usage(md, tw, p, c, k)
              end
              if cut and is_usage_only(ev) then ev, dropped = "", true end
            end
            kept[#kept + 1] = ev
          end
          if cut then
            -- complete events go out now; an incomplete last event waits for the next chunk
            if dropped or tail ~= "" or rest ~= "" then chunk:setBytes(table.concat(kept)) end
            tail = rest
          else
            tail = sub(rest, -MAX_TAIL) -- only read again, with the next chunk
          end
        end
        events = events + count_events(s)
        if total < 0 and events > 0 then
          local out = events
          if maxt > 0 and out > maxt then out = maxt end
          local _, micros = money(tw, prompt, out, 0)
          md:set(TW, "settle_tokens", prompt + out)
          md:set(TW, "settle_usd_micros", format("%d", micros))
        end
      elseif not too_big then
        size = size + n
        if size > json_max then too_big, body = true, {} else body[#body + 1] = s end
      end
      md:set(TW, "timing", format("%d,%d,%d,%d,%s", chunks, first, last, gapsum,
        table.concat(b, ",", 1, NGAP + 1)))
    end
  end
  if sse or chunks == 0 then return end
  md = h:streamInfo():dynamicMetadata()
  if too_big then
    md:set(TW, "outcome", "ok")
    md:set(TW, "settle_tokens", tw.reserve or 0)
    return
  end
  local text = table.concat(body)
  local head = sub(text, 1, 4096)
  if is_error(head) then
    if find(head, "rate_limit_exceeded", 1, true) ~= nil then
      md:set(TW, "outcome", "rate_limited")
    else
      md:set(TW, "outcome", "error")
    end
    return
  end
  md:set(TW, "outcome", "ok")
  local p, c, k = usage_of(text)
  if p == nil then
    md:set(TW, "settle_tokens", tw.reserve or 0) -- an answer without usage: the worst case
  else
    set_usage(md, tw, p, c, k)
  end
end
