-- Reads of the inference benchmarks (bench/pipeline.py, quota.py, fairness.py): progress and
-- timings of one tenant's jobs, from the database's own timestamps.

-- name: tenant_states
SELECT state, count(*) AS n FROM extraction_jobs WHERE tenant_id = %(tenant_id)s GROUP BY state

-- name: tenant_pending
-- How many of one tenant's jobs are not terminal (READY, RUNNING, RETRY_SCHEDULED), from the
-- admission counters: 16 rows, where tenant_states reads every version of every job of the tenant
-- (10.7 ms of PostgreSQL per call at 5,000 jobs, twice a second while a bench waits).
SELECT coalesce(sum(pending_jobs), 0)::bigint AS n FROM admission_counters WHERE scope = %(tenant_id)s

-- name: tenant_ingested
-- How many of one tenant's jobs the inference worker's ingest has taken into the execution inbox.
SELECT count(*) AS n FROM execution_inbox i JOIN extraction_jobs j ON j.id = i.job_id
WHERE j.tenant_id = %(tenant_id)s

-- name: tenant_span
-- From the first acceptance to the last terminal state of one tenant's jobs, in seconds.
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE finished_at IS NOT NULL) AS finished,
       extract(epoch FROM max(finished_at) - min(created_at))::float8 AS seconds,
       extract(epoch FROM min(created_at))::float8 AS first_accepted
FROM extraction_jobs WHERE tenant_id = %(tenant_id)s

-- name: tenant_finish_times
-- Each finished job's acceptance and finish time (epoch seconds), oldest first.
SELECT extract(epoch FROM created_at)::float8 AS accepted,
       extract(epoch FROM finished_at)::float8 AS finished
FROM extraction_jobs WHERE tenant_id = %(tenant_id)s AND finished_at IS NOT NULL
ORDER BY finished_at

-- name: job_timing
SELECT state, attempt, extract(epoch FROM finished_at - created_at)::float8 AS seconds
FROM extraction_jobs WHERE id = %(job_id)s

-- name: attempts_by_outcome
SELECT outcome, count(*) AS n FROM job_attempts GROUP BY outcome

-- name: jobs_by_state
SELECT state, count(*) AS n FROM extraction_jobs GROUP BY state

-- name: attempt_figures
-- What the capacity formula needs of a run: the mean token estimate of the tenant's jobs and the
-- mean latency of its answered provider calls.
SELECT (SELECT avg(estimated_tokens) FROM extraction_jobs WHERE tenant_id = %(tenant_id)s)::float8
           AS estimated_tokens,
       (SELECT avg(a.latency_ms) FROM job_attempts a JOIN extraction_jobs j ON j.id = a.job_id
         WHERE j.tenant_id = %(tenant_id)s AND a.http_status = 200)::float8 AS mean_latency_ms

-- name: first_call
-- When a job's first provider call started, in seconds after its acceptance, and how it ended.
SELECT extract(epoch FROM a.started_at - j.created_at)::float8 AS seconds, a.outcome, a.http_status
  FROM extraction_jobs j JOIN job_attempts a ON a.job_id = j.id
 WHERE j.id = %(job_id)s
 ORDER BY a.started_at
 LIMIT 1

-- name: transactions
-- Commits and rollbacks so far in this database, and the shared buffers its statements touched
-- (found in shared buffers or read in): published by PostgreSQL at most once a second.
SELECT xact_commit + xact_rollback AS xacts, blks_hit + blks_read AS blocks
FROM pg_stat_database WHERE datname = current_database()
