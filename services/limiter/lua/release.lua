-- release.lua: give a permit back with the provider's reported usage (DESIGN §5.5). Idempotent.
--
-- KEYS[1] permit     hash    the permit record
-- KEYS[2] inflight   zset    pool leases
-- KEYS[3] tinflight  zset    the permit's tenant's leases in the pool
-- KEYS[4] window     zset    requests in the sliding window
-- KEYS[5] wtokens    hash    tokens counted per request in the window
-- KEYS[6] wsum       string  sum of wtokens
-- KEYS[7] tbudget    hash    {day, used} of the permit's tenant in the pool
-- KEYS[8] kvheld     hash    a local pool's in-flight context tokens (the permit's entry freed)
-- KEYS[9] pace       hash    {r, t}: the pool's GCRA theoretical arrival times (acquire.lua)
-- ARGV[1] permit_id
-- ARGV[2] outcome: COMPLETED (tokens corrected to the usage), NOT_SENT (request and tokens
--         refunded), UNKNOWN (the whole reservation is kept; only the lease is freed)
-- ARGV[3] tokens used (input + output) as reported for COMPLETED; ignored otherwise
-- ARGV[4] retention_ms: how long the settled record is kept, so a repeat is recognised
-- ARGV[5] request interval (ms) of the pool's pace; 0: the pool is not paced
-- ARGV[6] token interval (ms per token) of the pool's pace
-- ARGV[7] '1': settle only if no retried Acquire handed the permit out again (acquire.lua marks
--         it); the caller that gave up on its Acquire then leaves it to the one that retried
--
-- Returns {'released', pool_in_flight_after, now_ms} | {'already', first_outcome, now_ms}
--       | {'handed_again', now_ms} | {'not_found', now_ms}
-- A lease that already expired is still settled: its tokens are corrected all the same.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pid = ARGV[1]
local outcome = ARGV[2]

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', now}
end
local rec = redis.call('HMGET', KEYS[1], 'state', 'outcome', 'tokens', 'day', 'budgeted', 'again')
if rec[1] == 'released' then
  return {'already', rec[2], now}
end
if ARGV[7] == '1' and rec[6] == '1' then
  return {'handed_again', now}
end
local reserved = tonumber(rec[3])

redis.call('ZREM', KEYS[2], pid)
redis.call('ZREM', KEYS[3], pid)
redis.call('HDEL', KEYS[8], pid)

local actual = reserved
if outcome == 'COMPLETED' then
  actual = tonumber(ARGV[3])
elseif outcome == 'NOT_SENT' then
  actual = 0
end

-- The window holds the request until it ages out; correct it while it is still there.
local counted = redis.call('HGET', KEYS[5], pid)
if counted then
  counted = tonumber(counted)
  if outcome == 'NOT_SENT' then
    redis.call('ZREM', KEYS[4], pid)
    redis.call('HDEL', KEYS[5], pid)
    redis.call('DECRBY', KEYS[6], counted)
  elseif outcome == 'COMPLETED' and actual ~= counted then
    redis.call('HSET', KEYS[5], pid, actual)
    redis.call('INCRBY', KEYS[6], actual - counted)
  end
end

-- A paced pool's TATs are moved back by what was not spent (forward if usage beat the
-- reservation), as the window's counts are: a request not sent gives its turn back, unless a
-- retried Acquire handed the permit out again (acquire.lua marks it): the NOT_SENT may then come
-- from the caller that gave up on its Acquire while the retrying one sends, so the turn is kept.
local request_ms = tonumber(ARGV[5] or '0') or 0
if outcome == 'NOT_SENT' and rec[6] == '1' then request_ms = 0 end
if request_ms > 0 and redis.call('EXISTS', KEYS[9]) == 1 then
  local token_ms = tonumber(ARGV[6])
  if outcome == 'NOT_SENT' then
    redis.call('HINCRBYFLOAT', KEYS[9], 'r', string.format('%.3f', -request_ms))
  end
  if actual ~= reserved then
    redis.call('HINCRBYFLOAT', KEYS[9], 't', string.format('%.3f', (actual - reserved) * token_ms))
  end
end

-- The tenant's daily budget is corrected only on the day the reservation was charged.
if rec[5] == '1' and actual ~= reserved then
  local b = redis.call('HMGET', KEYS[7], 'day', 'used')
  if b[1] == rec[4] then
    local used = (tonumber(b[2]) or 0) + actual - reserved
    if used < 0 then used = 0 end
    redis.call('HSET', KEYS[7], 'used', used)
  end
end

redis.call('HSET', KEYS[1], 'state', 'released', 'outcome', outcome, 'used', actual, 'released_at', now)
redis.call('PEXPIREAT', KEYS[1], now + tonumber(ARGV[4]))
return {'released', redis.call('ZCARD', KEYS[2]), now}
