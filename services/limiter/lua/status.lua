-- status.lua: what a pool uses now (for PoolStatus, metrics and autoscaling).
--
-- KEYS[1] inflight   zset    pool leases
-- KEYS[2] window     zset    requests in the sliding window
-- KEYS[3] wtokens    hash    tokens counted per request in the window
-- KEYS[4] wsum       string  sum of wtokens
-- KEYS[5] cooldown   string  cooldown end (ms)
-- ARGV[1] window_ms
--
-- Returns {in_flight, requests_in_window, tokens_in_window, cooldown_until_ms (0: none), now_ms}
-- It drops expired leases and requests that left the window, exactly as acquire.lua does, so the
-- figures are the ones the next Acquire would see.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local cutoff = now - tonumber(ARGV[1])
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

local cooldown_until = tonumber(redis.call('GET', KEYS[5]) or '0')
if cooldown_until <= now then cooldown_until = 0 end
return {
  redis.call('ZCARD', KEYS[1]),
  redis.call('ZCARD', KEYS[2]),
  tonumber(redis.call('GET', KEYS[4]) or '0'),
  cooldown_until,
  now,
}
