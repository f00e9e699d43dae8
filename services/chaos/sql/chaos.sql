-- What the chaos runner reads from a scenario's database (over the real port, never the proxy).

-- name: state_counts
SELECT state, count(*) AS n FROM extraction_jobs WHERE tenant_id = %(tenant_id)s GROUP BY state

-- name: delivery_counts
SELECT state, count(*) AS n FROM deliveries WHERE tenant_id = %(tenant_id)s GROUP BY state

-- name: jobs
-- A job that is not finished is explainable while its lease is live or its due time is ahead.
SELECT id::text AS id, state, state_version, attempt, fence,
       (state = 'RUNNING' AND lease_until > now()) AS live_lease,
       (state IN ('READY', 'RETRY_SCHEDULED') AND available_at > now()) AS due_later
FROM extraction_jobs
WHERE tenant_id = %(tenant_id)s

-- name: job_events
-- The state changes; the log's other events (a review closed, an ERP acknowledgement) change no state.
SELECT job_id::text AS job_id, seq, state, state_version
FROM job_events
WHERE tenant_id = %(tenant_id)s AND kind = 'state'
ORDER BY job_id, seq

-- name: attempts
SELECT a.job_id::text AS job_id, a.attempt, a.fence, a.outcome
FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id
WHERE j.tenant_id = %(tenant_id)s
ORDER BY a.id

-- name: deliveries
SELECT job_id::text AS job_id, event_type, state, attempts
FROM deliveries
WHERE tenant_id = %(tenant_id)s

-- name: backlog
-- Things an operator would look at when a job is stuck: events never published, dead letters.
SELECT (SELECT count(*) FROM outbox_events
         WHERE tenant_id = %(tenant_id)s AND published_at IS NULL) AS unpublished,
       (SELECT count(*) FROM dead_letters) AS dead_letters
