-- renew.lua: extend a held lease (the caller's heartbeat).
--
-- KEYS[1] permit     hash    the permit record
-- KEYS[2] inflight   zset    pool leases
-- KEYS[3] tinflight  zset    the permit's tenant's leases in the pool
-- ARGV[1] permit_id
-- ARGV[2] lease_ms: the new lease runs from now
-- ARGV[3] retention_ms: how long the permit record outlives its lease
--
-- Returns {'renewed', lease_expires_ms, now_ms} | {'released', now_ms} | {'expired', now_ms}
--       | {'not_found', now_ms}
-- An expired lease is not revived: its slot may already belong to someone else.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local pid = ARGV[1]

if redis.call('EXISTS', KEYS[1]) == 0 then
  return {'not_found', now}
end
local rec = redis.call('HMGET', KEYS[1], 'state', 'expires_at')
if rec[1] == 'released' then
  return {'released', now}
end
if tonumber(rec[2]) <= now then
  return {'expired', now}
end

local expires = now + tonumber(ARGV[2])
local function extend_to(key, at)
  local ttl = redis.call('PTTL', key)
  if ttl < 0 or now + ttl < at then redis.call('PEXPIREAT', key, at) end
end
redis.call('ZADD', KEYS[2], expires, pid)
extend_to(KEYS[2], expires)
redis.call('ZADD', KEYS[3], expires, pid)
extend_to(KEYS[3], expires)
redis.call('HSET', KEYS[1], 'expires_at', expires)
redis.call('PEXPIREAT', KEYS[1], expires + tonumber(ARGV[3]))
return {'renewed', expires, now}
