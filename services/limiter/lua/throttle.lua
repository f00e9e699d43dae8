-- throttle.lua: the provider answered 429; start (or keep) the pool's cooldown.
--
-- KEYS[1] cooldown   string  cooldown end (ms), PX-expiring
-- ARGV[1] retry_after_ms reported by the provider (> 0)
--
-- Returns {cooldown_until_ms, extended (1 or 0), now_ms}
-- A shorter report never shortens a longer cooldown already in force.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local wanted = now + tonumber(ARGV[1])
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current >= wanted then
  return {current, 0, now}
end
redis.call('SET', KEYS[1], wanted, 'PXAT', wanted)
return {wanted, 1, now}
