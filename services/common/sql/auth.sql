-- API key authentication (services/common/api/auth.py).

-- name: authenticate
-- An operator key belongs to no tenant: its tenant columns are NULL.
SELECT k.secret_hash, k.revoked_at, k.scope, k.label, t.id, t.name, t.weight, t.max_in_flight,
       t.max_pending_jobs, t.max_pending_bytes, t.max_pending_tokens, t.daily_token_budget,
       t.allowed_currencies, t.max_stored_bytes
FROM api_keys k
LEFT JOIN tenants t ON t.id = k.tenant_id
WHERE k.prefix = %(prefix)s
  AND (k.revoked_at IS NULL OR k.revoked_at > now())

-- name: live_keys
-- Which of these keys still open their routes: the keys of open event streams, looked up again.
SELECT prefix FROM api_keys
WHERE prefix = ANY (%(prefixes)s)
  AND (revoked_at IS NULL OR revoked_at > now())
