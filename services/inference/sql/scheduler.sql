-- Statements of the inference scheduler. Each pass locks its rows with SKIP LOCKED, so several
-- schedulers at once never handle the same job twice.

-- name: expired_leases
SELECT id, tenant_id, attempt, fence, deadline_at, claimed_by, lease_until
FROM extraction_jobs
WHERE state = 'RUNNING' AND lease_until < now()
ORDER BY lease_until
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: overdue_jobs
SELECT id, tenant_id, state, attempt, fence
FROM extraction_jobs
WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED') AND deadline_at <= now()
ORDER BY deadline_at
LIMIT %(batch)s
FOR UPDATE SKIP LOCKED

-- name: reschedule_job
-- A job taken from a RUNNING worker keeps the cost of the call that worker may have made: its
-- usage is unknown, so the whole reservation (estimated_tokens) is added to the job's usage.
UPDATE extraction_jobs
SET state = 'RETRY_SCHEDULED', state_version = state_version + 1, fence = fence + 1,
    lease_until = NULL, available_at = %(available_at)s, error_class = %(error_class)s,
    error_message = %(error_message)s, updated_at = now(),
    usage = CASE WHEN state = 'RUNNING'
                 THEN fatura_usage_add(usage, jsonb_build_object('total_tokens', estimated_tokens,
                                                                 'estimated_tokens', estimated_tokens))
                 ELSE usage END
WHERE id = %(job_id)s
RETURNING state_version

-- name: fail_job
UPDATE extraction_jobs
SET state = 'FAILED_TERMINAL', state_version = state_version + 1, fence = fence + 1,
    lease_until = NULL, error_class = %(error_class)s, error_message = %(error_message)s,
    finished_at = now(), updated_at = now(),
    usage = CASE WHEN state = 'RUNNING'
                 THEN fatura_usage_add(usage, jsonb_build_object('total_tokens', estimated_tokens,
                                                                 'estimated_tokens', estimated_tokens))
                 ELSE usage END
WHERE id = %(job_id)s
RETURNING state_version, priority, extract(epoch FROM now() - created_at)::float8 AS since_accepted

-- name: lease_expired_attempt
INSERT INTO job_attempts (job_id, attempt, fence, started_at, ended_at, outcome, error_class,
                          error_message, worker_id)
VALUES (%(job_id)s, %(attempt)s, %(fence)s, %(started_at)s, now(), 'lease_expired', 'lease_expired',
        'the lease expired before the worker completed the attempt',
        (SELECT left(claimed_by, 64) FROM extraction_jobs WHERE id = %(job_id)s))

-- name: due_jobs
-- The wake-up top-up needs to know only whether the due jobs outnumber the queued wake-ups, so
-- it stops counting at the wake-up target.
SELECT count(*) AS due
FROM (SELECT 1 FROM extraction_jobs
      WHERE state IN ('READY', 'RETRY_SCHEDULED') AND available_at <= now()
      LIMIT %(cap)s) AS due

-- name: runnable_backlog
-- The exact runnable backlog and its oldest eligible job, per priority: one index-only scan of
-- extraction_jobs_backlog per priority, never capped (migration 0015 measures it; 0026 puts the
-- tenant after the priority, which the count reads through either way).
SELECT p.priority, b.due, b.oldest, now() AS now
FROM unnest(%(priorities)s::text[]) AS p (priority)
CROSS JOIN LATERAL (
    SELECT count(*) AS due, min(j.available_at) AS oldest
    FROM extraction_jobs AS j
    WHERE j.priority = p.priority AND j.state IN ('READY', 'RETRY_SCHEDULED')
      AND j.available_at <= now()
) AS b

-- name: try_lead
SELECT pg_try_advisory_xact_lock(%(key)s) AS leader
