-- Queries of the webhook-endpoint API (tenant-scoped: every statement names the tenant).

-- name: insert_endpoint
INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, max_concurrency)
VALUES (%(endpoint_id)s, %(tenant_id)s, %(url)s, %(event_types)s, %(max_concurrency)s)

-- name: insert_secret
-- Sealed under the current master key (services/common/keyring.py); never stored in plaintext.
INSERT INTO webhook_secrets (endpoint_id, key_id, master_key_id, nonce, ciphertext)
VALUES (%(endpoint_id)s, %(key_id)s, %(master_key_id)s, %(nonce)s, %(ciphertext)s)

-- name: count_endpoints
SELECT count(*) AS n FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s

-- name: insert_ping
-- The verification ping: an ordinary delivery without a job, which the delivery scheduler wakes
-- and the delivery worker sends; its first 2xx marks the endpoint verified.
INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, job_id, body)
VALUES (%(delivery_id)s, %(event_id)s, %(event_type)s, %(endpoint_id)s, %(tenant_id)s, NULL, %(body)s)

-- name: list_endpoints
SELECT e.id, e.url, e.event_types, e.state, e.disabled_reason, e.verified_at, e.max_concurrency,
       e.consecutive_failures, e.consecutive_auth_failures, e.breaker_open_until, e.created_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object('key_id', s.key_id, 'created_at', s.created_at,
                                                     'not_after', s.not_after) ORDER BY s.created_at)
                 FROM webhook_secrets s
                 WHERE s.endpoint_id = e.id AND (s.not_after IS NULL OR s.not_after > now())),
                '[]'::jsonb) AS secrets
FROM webhook_endpoints e
WHERE e.tenant_id = %(tenant_id)s AND (%(endpoint_id)s::uuid IS NULL OR e.id = %(endpoint_id)s)
ORDER BY e.created_at, e.id

-- name: lock_endpoint
SELECT id, state FROM webhook_endpoints
WHERE tenant_id = %(tenant_id)s AND id = %(endpoint_id)s
FOR UPDATE

-- name: disable_endpoint
UPDATE webhook_endpoints
SET state = 'disabled', disabled_reason = %(reason)s, disabled_at = now(), updated_at = now()
WHERE id = %(endpoint_id)s AND state = 'enabled'

-- name: enable_endpoint
-- A fresh start: the health counters and the breaker are cleared.
UPDATE webhook_endpoints
SET state = 'enabled', disabled_reason = NULL, disabled_at = NULL, consecutive_failures = 0,
    consecutive_auth_failures = 0, breaker_open_until = NULL, updated_at = now()
WHERE id = %(endpoint_id)s

-- name: expire_secrets
-- The secrets in force now stay valid for the overlap window, then stop signing.
UPDATE webhook_secrets
SET not_after = LEAST(coalesce(not_after, 'infinity'),
                      clock_timestamp() + make_interval(secs => %(overlap_seconds)s))
WHERE endpoint_id = %(endpoint_id)s AND (not_after IS NULL OR not_after > now())

-- name: recover_endpoint
UPDATE deliveries
SET state = 'pending', reason = 'recovered by the tenant', next_attempt_at = now(), woken_at = NULL,
    attempts_base = attempts, updated_at = now()
WHERE endpoint_id = %(endpoint_id)s AND state IN ('failed', 'dead') AND created_at >= %(since)s
RETURNING delivery_id

-- name: deliveries_for_job
SELECT d.delivery_id, d.event_id, d.event_type, d.endpoint_id, d.job_id, d.state, d.reason,
       d.attempts, d.last_status, d.next_attempt_at, d.created_at, d.updated_at, d.delivered_at,
       d.ack_outcome, d.ack_reason, d.acked_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'attempt', a.attempt, 'started_at', a.started_at, 'ended_at', a.ended_at,
                     'outcome', a.outcome, 'http_status', a.http_status, 'error_class', a.error_class,
                     'response_body', a.response_body, 'retry_after_ms', a.retry_after_ms,
                     'latency_ms', a.latency_ms) ORDER BY a.id)
                 FROM delivery_attempts a WHERE a.delivery_id = d.delivery_id), '[]'::jsonb) AS attempt_log
FROM deliveries d
WHERE d.tenant_id = %(tenant_id)s AND d.job_id = %(job_id)s
ORDER BY d.created_at, d.delivery_id

-- name: delivery_by_id
SELECT d.delivery_id, d.event_id, d.event_type, d.endpoint_id, d.job_id, d.state, d.reason,
       d.attempts, d.last_status, d.next_attempt_at, d.created_at, d.updated_at, d.delivered_at,
       d.ack_outcome, d.ack_reason, d.acked_at,
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'attempt', a.attempt, 'started_at', a.started_at, 'ended_at', a.ended_at,
                     'outcome', a.outcome, 'http_status', a.http_status, 'error_class', a.error_class,
                     'response_body', a.response_body, 'retry_after_ms', a.retry_after_ms,
                     'latency_ms', a.latency_ms) ORDER BY a.id)
                 FROM delivery_attempts a WHERE a.delivery_id = d.delivery_id), '[]'::jsonb) AS attempt_log
FROM deliveries d
WHERE d.delivery_id = %(delivery_id)s

-- name: lock_delivery
SELECT d.delivery_id, d.state, e.state AS endpoint_state
FROM deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.tenant_id = %(tenant_id)s AND d.delivery_id = %(delivery_id)s
FOR UPDATE OF d

-- name: resend_delivery
UPDATE deliveries
SET state = 'pending', reason = 'resent by the tenant', next_attempt_at = now(), woken_at = NULL,
    attempts_base = attempts, updated_at = now()
WHERE delivery_id = %(delivery_id)s
