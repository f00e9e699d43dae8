-- Statements of the unit of work: a job's state change is recorded as a job event and an outbox
-- event in the same transaction as the row change itself.
--
-- The two inserts are written once, here, as fragments: {job_id} is where the job's id comes from,
-- {source} what it is selected from, and {state_version}, {detail} and {payload} the version the
-- change made, its detail and the event's payload: parameters, or, for a statement that writes the
-- row and records its change at once, what that write returned. services/common/uow.py builds from them both the unit of
-- work's statements and the CTEs the single-statement acceptance embeds (``change_ctes``), so
-- every writer of job + event + outbox writes the same columns from the same JobChange.params().

-- name: job_event_fragment
INSERT INTO job_events (tenant_id, job_id, state, state_version, detail)
SELECT %(tenant_id)s, {job_id}, %(state)s, {state_version}, {detail}{source}

-- name: outbox_event_fragment
INSERT INTO outbox_events (event_id, tenant_id, job_id, event_type, payload)
SELECT %(event_id)s, %(tenant_id)s, {job_id}, %(event_type)s, {payload}{source}

-- name: notify_outbox
NOTIFY fatura_outbox
