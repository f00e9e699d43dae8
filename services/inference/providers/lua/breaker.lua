-- breaker.lua: one channel's circuit breaker; the same machine as breaker.py (admit / report).
--
-- KEYS[1] state     hash    open_until, trial_until (ms), seq (member counter for failures)
-- KEYS[2] failures  zset    one member per retryable failure, scored by its time (ms)
-- ARGV[1] op        'admit' | 'failure' | 'success' | 'release' | 'peek' (read only)
-- ARGV[2] threshold failures within the window that open the channel
-- ARGV[3] window_ms
-- ARGV[4] cooldown_ms
-- ARGV[5] trial_ms  how long one half-open trial holds the channel
-- ARGV[6] trial     '1' when the call being reported was the half-open trial
-- ARGV[7] now_ms    optional: a clock for tests; otherwise Redis TIME
--
-- Returns {verdict, wait_ms, failures_in_window, now_ms}
--   admit: verdict 0 closed (send), 1 trial (send, the one half-open call), 2 open (skip, wait_ms)
--   report: verdict 2 when the channel is open afterwards, else 0
-- Both keys expire once nothing in them can matter any more.

local now
if ARGV[7] and ARGV[7] ~= '' then
  now = tonumber(ARGV[7])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local op = ARGV[1]
local threshold = tonumber(ARGV[2])
local window = tonumber(ARGV[3])
local cooldown = tonumber(ARGV[4])
local trial_ms = tonumber(ARGV[5])
local trial = ARGV[6] == '1'
local ttl = window + cooldown + trial_ms

local state = redis.call('HMGET', KEYS[1], 'open_until', 'trial_until')
local open_until = tonumber(state[1] or '0')
local trial_until = tonumber(state[2] or '0')

-- Failures at or before now - window are forgotten (breaker.py keeps now - t < window).
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[2])

if op == 'admit' then
  if open_until > now then
    return {2, open_until - now, count, now}
  end
  if count < threshold then
    return {0, 0, count, now}
  end
  if trial_until > now then
    return {2, trial_until - now, count, now}
  end
  redis.call('HSET', KEYS[1], 'trial_until', now + trial_ms)
  redis.call('PEXPIRE', KEYS[1], ttl)
  return {1, 0, count, now}
end

if op == 'failure' then
  local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  redis.call('ZADD', KEYS[2], now, now .. '-' .. seq)
  count = count + 1
  if count >= threshold then
    open_until = now + cooldown
    redis.call('HSET', KEYS[1], 'open_until', open_until)
  end
  if trial then
    redis.call('HSET', KEYS[1], 'trial_until', 0)
  end
  redis.call('PEXPIRE', KEYS[1], ttl)
  redis.call('PEXPIRE', KEYS[2], ttl)
  if open_until > now then
    return {2, open_until - now, count, now}
  end
  return {0, 0, count, now}
end

if trial and op == 'success' then
  redis.call('DEL', KEYS[1], KEYS[2])
  return {0, 0, 0, now}
end
if trial and op == 'release' then
  redis.call('HSET', KEYS[1], 'trial_until', 0)
end
if open_until > now then
  return {2, open_until - now, count, now}
end
return {0, 0, count, now}
