-- Statements of the unit of work: a job's state change is recorded as a job event and an outbox
-- event in the same transaction as the row change itself.

-- name: record_change
WITH job_event AS (
    INSERT INTO job_events (tenant_id, job_id, state, state_version, detail)
    VALUES (%(tenant_id)s, %(job_id)s, %(state)s, %(state_version)s, %(detail)s)
)
INSERT INTO outbox_events (event_id, tenant_id, job_id, event_type, payload)
VALUES (%(event_id)s, %(tenant_id)s, %(job_id)s, %(event_type)s, %(payload)s)

-- name: record_job_event
INSERT INTO job_events (tenant_id, job_id, state, state_version, detail)
VALUES (%(tenant_id)s, %(job_id)s, %(state)s, %(state_version)s, %(detail)s)

-- name: notify_outbox
NOTIFY fatura_outbox
