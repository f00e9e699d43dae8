-- The Kafka ingress and the job-event export (services/acceptance/kafka).

-- name: tenant
-- The tenant a record speaks for, with the admission limits its jobs are held to.
SELECT id, name, weight, max_in_flight, max_pending_jobs, max_pending_bytes, max_pending_tokens,
       daily_token_budget, allowed_currencies, max_stored_bytes
FROM tenants
WHERE id = %(tenant_id)s

-- name: inbox_seen
-- Whether the ingress has already finished with this record (a redelivery is a no-op).
SELECT outcome, job_id FROM kafka_ingress_inbox
WHERE topic = %(topic)s AND partition = %(partition)s AND "offset" = %(offset)s

-- name: inbox_insert
-- Run inside the transaction that accepts the record's job, or alone for a replay or a dead letter.
-- A second consumer that took the same record during a rebalance finds the row and writes nothing.
INSERT INTO kafka_ingress_inbox
    (topic, partition, "offset", outcome, tenant_id, idempotency_key, job_id, reason)
VALUES (%(topic)s, %(partition)s, %(offset)s, %(outcome)s, %(tenant_id)s, %(idempotency_key)s,
        %(job_id)s, %(reason)s)
ON CONFLICT (topic, partition, "offset") DO NOTHING

-- name: export_cursor
-- The export's cursor, created at 0 the first time.
INSERT INTO kafka_export_cursors (name) VALUES (%(name)s)
ON CONFLICT (name) DO UPDATE SET name = excluded.name
RETURNING through

-- name: export_advance
UPDATE kafka_export_cursors SET through = %(through)s, updated_at = now()
WHERE name = %(name)s AND through < %(through)s

-- name: export_poll
-- Job events after the cursor, beside the snapshot's bounds (services/acceptance/watermark.py
-- decides how far they can be sent without skipping one that commits late).
SELECT s.xmin, s.xmax, e.seq, e.tenant_id, e.job_id, e.state, e.state_version, e.kind, e.at
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
             pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) s
LEFT JOIN LATERAL (
    SELECT seq, tenant_id, job_id, state, state_version, kind, at
    FROM job_events
    WHERE seq > %(after)s
    ORDER BY seq
    LIMIT %(limit)s
) e ON true
ORDER BY e.seq
