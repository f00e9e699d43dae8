-- The ERP's business acknowledgement of a delivery (DESIGN §5.13), and the deliveries still
-- waiting for one. An acknowledgement is authenticated by the endpoint's secret, not by a tenant's
-- key: the delivery it names decides the endpoint, and the endpoint the tenant.

-- name: ack_target
-- The delivery's endpoint and its secrets in force, sealed (one row per secret; one row with
-- NULL secret columns when none is in force).
SELECT d.delivery_id, d.endpoint_id, s.key_id, s.master_key_id, s.nonce, s.ciphertext
FROM deliveries d
LEFT JOIN webhook_secrets s
       ON s.endpoint_id = d.endpoint_id AND (s.not_after IS NULL OR s.not_after > now())
WHERE d.delivery_id = %(delivery_id)s

-- name: lock_delivery
SELECT delivery_id, tenant_id, endpoint_id, job_id, event_type, state, delivered_at, ack_outcome,
       ack_reason, acked_at
FROM deliveries
WHERE delivery_id = %(delivery_id)s
FOR UPDATE

-- name: record_ack
UPDATE deliveries
SET ack_outcome = %(outcome)s, ack_reason = %(reason)s, acked_at = now(), updated_at = now()
WHERE delivery_id = %(delivery_id)s
RETURNING acked_at

-- name: job_erp
-- The job shows the latest acknowledgement; its state does not change (no state-machine trigger
-- fires: only the state column has one).
UPDATE extraction_jobs
SET erp = %(erp)s
WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s
RETURNING state, state_version

-- name: insert_ack_event
-- In the job's event log beside its state changes, at the job's current state and version.
INSERT INTO job_events (tenant_id, job_id, state, state_version, kind, detail)
VALUES (%(tenant_id)s, %(job_id)s, %(state)s, %(state_version)s, 'erp_ack', %(detail)s)

-- name: open_erp_review
-- A rejection by the ERP is a person's to resolve: one task per refused delivery, with the audit
-- trail's first line, in the acknowledgement's transaction.
WITH task AS (
    INSERT INTO review_tasks (id, tenant_id, job_id, kind, reasons, job_version, delivery_id)
    VALUES (%(task_id)s, %(tenant_id)s, %(job_id)s, 'erp_rejected', %(reasons)s, %(job_version)s,
            %(delivery_id)s)
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id
)
INSERT INTO review_task_events (task_id, tenant_id, actor, action, detail)
SELECT id, tenant_id, 'erp', 'opened', %(detail)s FROM task
RETURNING task_id

-- name: unacknowledged
-- A tenant's deliveries received (2xx) longer ago than the window and not acknowledged, oldest
-- first, after the cursor's (delivered_at, delivery_id). Served by deliveries_unacknowledged.
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
WHERE d.tenant_id = %(tenant_id)s AND d.state = 'delivered' AND d.acked_at IS NULL
  AND d.event_type = ANY (%(event_types)s)
  AND d.delivered_at < now() - make_interval(secs => %(window_seconds)s)
  AND (%(after_delivered_at)s::timestamptz IS NULL
       OR (d.delivered_at, d.delivery_id) > (%(after_delivered_at)s, %(after_id)s))
ORDER BY d.delivered_at, d.delivery_id
LIMIT %(limit)s

-- name: cursor_position
SELECT delivered_at FROM deliveries
WHERE delivery_id = %(delivery_id)s AND tenant_id = %(tenant_id)s AND delivered_at IS NOT NULL
