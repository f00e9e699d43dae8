-- acquire.lua: take one permit from a pool -- every dimension or none.
--
-- KEYS[1] inflight   zset    permit_id -> lease expiry (ms)   pool leases held now
-- KEYS[2] window     zset    permit_id -> grant time (ms)     requests in the sliding window (RPM)
-- KEYS[3] wtokens    hash    permit_id -> tokens counted      tokens of those requests (TPM)
-- KEYS[4] wsum       string  sum of wtokens                   TPM used
-- KEYS[5] cooldown   string  cooldown end (ms), PX-expiring   set by ReportThrottle
-- KEYS[6] tinflight  zset    permit_id -> lease expiry (ms)   this tenant's leases in the pool
-- KEYS[7] tbudget    hash    {day, used}                      this tenant's tokens in the pool today
-- KEYS[8] permit     hash    the permit record; also the request_key's idempotency record,
--                            because the permit id is derived from the request_key
-- KEYS[9] kvheld     hash    permit_id -> KV tokens held      a local pool's in-flight context
--                            tokens; an entry counts while its lease in KEYS[1] is live
-- KEYS[10] kvline    hash    permit_id -> "joined_ms tokens last_ask_ms"   the requests a KV
--                            denial turned away, oldest first: the oldest heads the line
-- KEYS[11] pace      hash    {r, t}: theoretical arrival times (ms) of the pool's next request
--                            and next token (GCRA); only with ARGV[16] = 'gcra'
-- ARGV[1]  permit_id
-- ARGV[2]  tokens to reserve (estimated input + max output)
-- ARGV[3]  lease_ms
-- ARGV[4]  rpm: requests per window
-- ARGV[5]  tpm: tokens per window
-- ARGV[6]  max in-flight for the pool
-- ARGV[7]  window_ms
-- ARGV[8]  tenant max in-flight in this pool (-1: none)
-- ARGV[9]  tenant daily token budget in this pool (-1: none)
-- ARGV[10] fingerprint of the request (tenant and token figures), to catch a reused request_key
-- ARGV[11] retention_ms: how long the permit record outlives its lease
-- ARGV[12] cap (ms) on the retry hint of an in-flight denial
-- ARGV[13] KV token capacity of a local pool (-1: the pool has no such dimension)
-- ARGV[14] KV tokens this request holds while in flight (prompt + max output, in whole blocks)
-- ARGV[15] how long (ms) a request keeps its place in the KV line without asking again
-- ARGV[16] pacing: 'gcra' (one request every window_ms/rpm ms, each token window_ms/tpm ms, on
--          top of the window's caps) or 'window' (the window's caps alone: it may be spent at once)
-- ARGV[17] burst_ms: with 'gcra', how far ahead of now the paces may run (at least one request)
-- ARGV[18] now_ms: the clock, for tests that drive time; empty in production (Redis TIME)
--
-- Returns one of
--   {'granted',  permit_id, lease_expires_ms, pool_in_flight_after, now_ms}
--   {'existing', permit_id, lease_expires_ms, state, now_ms}    state: held | released | expired
--   {'conflict', now_ms}                                        same request_key, other figures
--   {'denied',   reason, retry_after_ms, now_ms}                reason: RPM TPM IN_FLIGHT
--                                                               TENANT_IN_FLIGHT TENANT_BUDGET COOLDOWN
--                                                               KV_TOKENS
-- The time is Redis's own (TIME), never the caller's clock, unless a test passes ARGV[18].
--
-- GCRA (generic cell rate algorithm): each pace is a theoretical arrival time (TAT). A request is
-- admitted while both TATs are at most the tolerance (burst_ms minus one request interval) ahead
-- of now; it then moves the request TAT one interval and the token TAT its reservation times the
-- token interval. The token test does not depend on the request's size, so a large request is not
-- starved by small ones; it may overshoot the burst by its own size, once.

local now
if ARGV[18] ~= nil and ARGV[18] ~= '' then
  now = tonumber(ARGV[18])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local pid = ARGV[1]
local tokens = tonumber(ARGV[2])
local lease_ms = tonumber(ARGV[3])
local rpm = tonumber(ARGV[4])
local tpm = tonumber(ARGV[5])
local max_in_flight = tonumber(ARGV[6])
local window_ms = tonumber(ARGV[7])
local tenant_max = tonumber(ARGV[8])
local budget = tonumber(ARGV[9])
local retention_ms = tonumber(ARGV[11])
local in_flight_hint_cap = tonumber(ARGV[12])
local kv_capacity = tonumber(ARGV[13])
local kv_tokens = tonumber(ARGV[14])

-- A retried RPC: the permit for this request_key already exists.
if redis.call('EXISTS', KEYS[8]) == 1 then
  local rec = redis.call('HMGET', KEYS[8], 'fp', 'state', 'expires_at')
  if rec[1] ~= ARGV[10] then
    return {'conflict', now}
  end
  local state = rec[2]
  local expires = tonumber(rec[3])
  if state == 'held' and expires <= now then
    state = 'expired'
  end
  if state == 'held' then
    -- Handed out again: the caller that asked first may release it NOT_SENT while this one sends
    -- (release.lua then keeps the pace's turn).
    redis.call('HSET', KEYS[8], 'again', 1)
  end
  return {'existing', pid, expires, state, now}
end

-- Expired leases free their slots with no client action.
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
-- A local pool's KV tokens count only for live leases: an entry whose lease expired (or was
-- swept by another script) is dropped here. Bounded by the pool's max_in_flight.
local kv_used = 0
local kv_soonest = nil
if kv_capacity >= 0 then
  local held = redis.call('HGETALL', KEYS[9])
  for i = 1, #held, 2 do
    local lease = redis.call('ZSCORE', KEYS[1], held[i])
    if lease then
      kv_used = kv_used + tonumber(held[i + 1])
      lease = tonumber(lease)
      if kv_soonest == nil or lease < kv_soonest then kv_soonest = lease end
    else
      redis.call('HDEL', KEYS[9], held[i])
    end
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now)

-- Requests older than the window leave it, taking their tokens with them.
local cutoff = now - window_ms
while true do
  local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, 500)
  if #old == 0 then break end
  local counted = redis.call('HMGET', KEYS[3], unpack(old))
  local freed = 0
  for i = 1, #counted do freed = freed + (tonumber(counted[i]) or 0) end
  redis.call('HDEL', KEYS[3], unpack(old))
  redis.call('ZREM', KEYS[2], unpack(old))
  if freed ~= 0 then redis.call('DECRBY', KEYS[4], freed) end
  if #old < 500 then break end
end

-- Check every dimension before changing any. Of the exhausted ones, report the one that frees
-- last: retrying before then cannot succeed.
local reason = nil
local retry = -1
local function deny(why, after)
  if after < 1 then after = 1 end
  if after > retry then
    reason = why
    retry = after
  end
end

local cooldown_until = tonumber(redis.call('GET', KEYS[5]) or '0')
if cooldown_until > now then
  deny('COOLDOWN', cooldown_until - now)
end

local day = math.floor(now / 86400000)
local used_today = 0
if budget >= 0 then
  local b = redis.call('HMGET', KEYS[7], 'day', 'used')
  if tonumber(b[1]) == day then used_today = tonumber(b[2]) or 0 end
  if used_today + tokens > budget then
    deny('TENANT_BUDGET', (day + 1) * 86400000 - now)
  end
end

local requests = redis.call('ZCARD', KEYS[2])
if requests >= rpm then
  -- The (requests - rpm + 1)-th oldest request has to leave the window first.
  local nth = redis.call('ZRANGE', KEYS[2], requests - rpm, requests - rpm, 'WITHSCORES')
  deny('RPM', tonumber(nth[2]) + window_ms - now)
end

local tokens_used = tonumber(redis.call('GET', KEYS[4]) or '0')
if tokens_used + tokens > tpm then
  -- Walk the window oldest first until enough tokens would have left it (bounded walk).
  local need = tokens_used + tokens - tpm
  local freed = 0
  local when = nil
  local when_last = nil
  local start = 0
  while when == nil and start < 2000 do
    local page = redis.call('ZRANGE', KEYS[2], start, start + 199, 'WITHSCORES')
    if #page == 0 then break end
    local counted = {}
    for i = 1, #page, 2 do counted[#counted + 1] = page[i] end
    local values = redis.call('HMGET', KEYS[3], unpack(counted))
    for i = 1, #values do
      freed = freed + (tonumber(values[i]) or 0)
      if freed >= need then
        when = tonumber(page[2 * i])
        break
      end
    end
    if when == nil then when_last = tonumber(page[#page]) end
    start = start + 200
  end
  if when == nil then
    -- Not enough in the first 2000 requests (or the limit shrank on reload): try again once the
    -- newest request looked at has left the window, or after a whole window.
    when = when_last or now
  end
  deny('TPM', when + window_ms - now)
end

local gcra = ARGV[16] == 'gcra'
local tat_r, tat_t, request_ms, token_ms
if gcra then
  request_ms = window_ms / rpm
  token_ms = window_ms / tpm
  local tolerance = math.max(tonumber(ARGV[17]), request_ms) - request_ms
  local pace = redis.call('HMGET', KEYS[11], 'r', 't')
  tat_r = math.max(tonumber(pace[1]) or now, now)
  tat_t = math.max(tonumber(pace[2]) or now, now)
  if tat_r - now > tolerance then
    deny('RPM', math.ceil(tat_r - tolerance - now))
  end
  if tat_t - now > tolerance then
    deny('TPM', math.ceil(tat_t - tolerance - now))
  end
end

local in_flight = redis.call('ZCARD', KEYS[1])
if in_flight >= max_in_flight then
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  deny('IN_FLIGHT', math.min(tonumber(first[2]) - now, in_flight_hint_cap))
end

-- Requests a KV denial turned away wait in a line, in the order they were first turned away.
-- The oldest heads it: until it is granted (or stops asking), every other request gets only the
-- KV it leaves, so a long document is not starved by short ones slipping into every gap; and when
-- it is granted the next oldest heads the line, not whichever request happens to ask first.
-- Bounded by the requests that asked within the hold time (at most 1024 join).
local in_line = false
if kv_capacity >= 0 then
  local hold = tonumber(ARGV[15])
  local head, head_joined, head_tokens, joined_at = nil, nil, 0, now
  local line = redis.call('HGETALL', KEYS[10])
  for i = 1, #line, 2 do
    local who = line[i]
    local joined, held, last = string.match(line[i + 1], '^(%d+) (%d+) (%d+)$')
    joined, held, last = tonumber(joined), tonumber(held), tonumber(last)
    if last + hold < now then
      redis.call('HDEL', KEYS[10], who)  -- it stopped asking: it leaves the line
    else
      if who == pid then
        in_line = true
        joined_at = joined
      end
      if head == nil or joined < head_joined or (joined == head_joined and who < head) then
        head, head_joined, head_tokens = who, joined, held
      end
    end
  end
  local kv_limit = kv_capacity
  if head ~= nil and head ~= pid then kv_limit = kv_capacity - head_tokens end
  local kv_denied = kv_used + kv_tokens > kv_limit
  if kv_denied then
    -- A release frees KV at any moment; the soonest lease expiry is the latest it must free.
    deny('KV_TOKENS', math.min((kv_soonest or now) - now, in_flight_hint_cap))
  end
  if in_line or (kv_denied and #line < 2048) then
    -- Asking again keeps the place; a grant below takes the request out of the line.
    redis.call('HSET', KEYS[10], pid, joined_at .. ' ' .. kv_tokens .. ' ' .. now)
    redis.call('PEXPIRE', KEYS[10], hold * 2)
    in_line = true
  end
end

if tenant_max >= 0 then
  local held = redis.call('ZCARD', KEYS[6])
  if held >= tenant_max then
    local first = redis.call('ZRANGE', KEYS[6], 0, 0, 'WITHSCORES')
    local after = in_flight_hint_cap
    if first[2] then after = math.min(tonumber(first[2]) - now, in_flight_hint_cap) end
    deny('TENANT_IN_FLIGHT', after)
  end
end

if reason then
  return {'denied', reason, retry, now}
end

-- Grant: take every dimension.
local expires = now + lease_ms
local function extend_to(key, at)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or now + ttl < at then redis.call('PEXPIREAT', key, at) end
end
redis.call('ZADD', KEYS[1], expires, pid)
extend_to(KEYS[1], expires)
redis.call('ZADD', KEYS[6], expires, pid)
extend_to(KEYS[6], expires)
if kv_capacity >= 0 then
  -- No TTL: a renewed lease outlives any expiry set here; stale entries are pruned above.
  redis.call('HSET', KEYS[9], pid, kv_tokens)
  if in_line then redis.call('HDEL', KEYS[10], pid) end
end
redis.call('ZADD', KEYS[2], now, pid)
redis.call('HSET', KEYS[3], pid, tokens)
redis.call('INCRBY', KEYS[4], tokens)
-- The three window keys expire together, one window after the newest request.
for i = 2, 4 do redis.call('PEXPIREAT', KEYS[i], now + window_ms + 1000) end
if gcra then
  tat_r = tat_r + request_ms
  tat_t = tat_t + tokens * token_ms
  redis.call('HSET', KEYS[11], 'r', string.format('%.3f', tat_r), 't', string.format('%.3f', tat_t))
  -- Once both paces are behind the clock the hash says nothing a missing one would not.
  redis.call('PEXPIREAT', KEYS[11], math.ceil(math.max(tat_r, tat_t)) + 1000)
end
if budget >= 0 then
  redis.call('HSET', KEYS[7], 'day', day, 'used', used_today + tokens)
  redis.call('PEXPIREAT', KEYS[7], (day + 2) * 86400000)
end
redis.call('HSET', KEYS[8], 'state', 'held', 'tokens', tokens, 'granted_at', now,
  'expires_at', expires, 'day', day, 'budgeted', budget >= 0 and 1 or 0, 'fp', ARGV[10])
redis.call('PEXPIREAT', KEYS[8], expires + retention_ms)
return {'granted', pid, expires, in_flight + 1, now}
