-- Statements of the unit of work: a job's state change is recorded as a job event and an outbox
-- event in the same transaction as the row change itself.
--
-- The two inserts are written once, here, as fragments: {job_id} is where the job's id comes from
-- and {source} what it is selected from. services/common/uow.py builds from them both the unit of
-- work's statements and the CTEs the single-statement acceptance embeds (``change_ctes``), so
-- every writer of job + event + outbox writes the same columns from the same JobChange.params().

-- name: job_event_fragment
INSERT INTO job_events (tenant_id, job_id, state, state_version, detail)
SELECT %(tenant_id)s, {job_id}, %(state)s, %(state_version)s, %(detail)s{source}

-- name: outbox_event_fragment
INSERT INTO outbox_events (event_id, tenant_id, job_id, event_type, payload)
SELECT %(event_id)s, %(tenant_id)s, {job_id}, %(event_type)s, %(payload)s{source}

-- name: notify_outbox
NOTIFY fatura_outbox
