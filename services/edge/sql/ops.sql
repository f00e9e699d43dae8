-- The operator's cross-tenant reads (services/edge/ops_store.py). Read only: the edge writes
-- nothing here. Every list is bounded by %(limit)s.

-- name: job
SELECT id, tenant_id, state, state_version, attempt, fence, priority, schema_version, model_policy,
       model, claimed_by, lease_until, available_at, deadline_at, created_at, updated_at,
       finished_at, error_class, error_message, usage, review_reasons, decided_by
FROM extraction_jobs
WHERE id = %(job_id)s

-- name: job_attempts
SELECT attempt, fence, channel, model, started_at, ended_at, outcome, http_status, error_class,
       error_message, retry_after_ms, input_tokens, output_tokens, latency_ms, worker_id,
       time_to_first_token_ms, inter_token_ms
FROM job_attempts
WHERE job_id = %(job_id)s
ORDER BY attempt, id
LIMIT %(limit)s

-- name: quarantine
SELECT id, inbox, event_id, stored_digest, received_digest, payload, received_at
FROM inbox_quarantine
WHERE (%(inbox)s::text IS NULL OR inbox = %(inbox)s)
  AND (%(since)s::timestamptz IS NULL OR received_at >= %(since)s)
ORDER BY id DESC
LIMIT %(limit)s

-- name: endpoints
-- The breaker is open while breaker_open_until is in the future (services/delivery/outcomes.py).
-- The last outcome is the newest attempt of the endpoint's most recently updated delivery that was
-- attempted at all, found by one probe of deliveries_by_endpoint (endpoint_id, state, updated_at) per delivery state.
SELECT e.id, e.tenant_id, e.url, e.state, e.disabled_reason, e.disabled_at, e.verified_at,
       e.consecutive_failures, e.consecutive_auth_failures, e.breaker_open_until,
       e.breaker_open_until IS NOT NULL AND e.breaker_open_until > now() AS breaker_open,
       e.max_concurrency, last.delivery_id AS last_delivery_id, last.outcome AS last_outcome,
       last.http_status AS last_http_status, last.error_class AS last_error_class,
       last.ended_at AS last_attempt_at
FROM webhook_endpoints e
LEFT JOIN LATERAL (
    SELECT a.delivery_id, a.outcome, a.http_status, a.error_class, a.ended_at
    FROM (SELECT newest.delivery_id
          FROM unnest(ARRAY['pending', 'delivering', 'delivered', 'failed', 'dead']) AS s (state)
          CROSS JOIN LATERAL (
              SELECT d.delivery_id, d.updated_at FROM deliveries d
              WHERE d.endpoint_id = e.id AND d.state = s.state AND d.attempts > 0
              ORDER BY d.updated_at DESC LIMIT 1
          ) AS newest
          ORDER BY newest.updated_at DESC LIMIT 1) AS recent
    CROSS JOIN LATERAL (
        SELECT delivery_id, outcome, http_status, error_class, ended_at
        FROM delivery_attempts
        WHERE delivery_attempts.delivery_id = recent.delivery_id
        ORDER BY id DESC LIMIT 1
    ) AS a
) AS last ON true
WHERE (%(state)s::text IS NULL OR e.state = %(state)s)
  AND (%(tenant_id)s::uuid IS NULL OR e.tenant_id = %(tenant_id)s)
  AND (%(breaker)s::text IS NULL
       OR (%(breaker)s = 'open') = (e.breaker_open_until IS NOT NULL AND e.breaker_open_until > now()))
ORDER BY e.consecutive_failures DESC, e.created_at, e.id
LIMIT %(limit)s
