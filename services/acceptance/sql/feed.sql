-- The job event feed (services/acceptance/feed.py) and the relay's pruning of old job events.
-- Every read that pairs events with the horizon or the snapshot's bounds is one statement, so both
-- come from one snapshot.

-- name: listen
-- A wake-up only: writers notify this channel after committing a change that has an outbox event;
-- the feed reads everything else within a tick.
LISTEN fatura_outbox

-- name: newest
SELECT coalesce(max(seq), 0) AS newest FROM job_events

-- name: poll
-- The one read per tick that serves every subscriber of a process.
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

-- name: poll_seqs
-- The same read with no stream open: the numbers alone, for the watermark.
SELECT s.xmin, s.xmax, e.seq
FROM (SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin,
             pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) s
LEFT JOIN LATERAL (
    SELECT seq FROM job_events WHERE seq > %(after)s ORDER BY seq LIMIT %(limit)s
) e ON true
ORDER BY e.seq

-- name: replay_tenant
-- A tenant stream catching up from its cursor, beside the horizon: a horizon past the cursor means
-- events it missed were pruned.
SELECT h.pruned_through, e.seq, e.tenant_id, e.job_id, e.state, e.state_version, e.kind, e.at
FROM job_event_horizon h
LEFT JOIN LATERAL (
    SELECT seq, tenant_id, job_id, state, state_version, kind, at
    FROM job_events
    WHERE tenant_id = %(tenant_id)s AND seq > %(after)s AND seq <= %(upto)s
    ORDER BY seq
    LIMIT %(limit)s
) e ON true
ORDER BY e.seq

-- name: replay_job
SELECT h.pruned_through, e.seq, e.tenant_id, e.job_id, e.state, e.state_version, e.kind, e.at
FROM job_event_horizon h
LEFT JOIN LATERAL (
    SELECT seq, tenant_id, job_id, state, state_version, kind, at
    FROM job_events
    WHERE job_id = %(job_id)s AND tenant_id = %(tenant_id)s AND seq > %(after)s AND seq <= %(upto)s
    ORDER BY seq
    LIMIT %(limit)s
) e ON true
ORDER BY e.seq

-- name: horizon
-- How far events were pruned, and the newest seq: a cursor above it is no id this server sent.
SELECT pruned_through, (SELECT coalesce(max(seq), 0) FROM job_events) AS newest FROM job_event_horizon

-- name: find_job
-- A job stream opens only on the tenant's own job.
SELECT id FROM extraction_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s

-- name: snapshot_job
-- The job as it is now, and the newest seq in the same snapshot: an event above it committed after
-- this read, so it is newer than what the snapshot shows.
SELECT (SELECT coalesce(max(seq), 0) FROM job_events) AS newest, j.id AS job_id, j.state, j.state_version
FROM (SELECT 1) one
LEFT JOIN extraction_jobs j ON j.id = %(job_id)s AND j.tenant_id = %(tenant_id)s

-- name: snapshot_tenant
-- The tenant's unfinished jobs, newest first (one more than the limit tells that there are more).
SELECT (SELECT coalesce(max(seq), 0) FROM job_events) AS newest, j.id AS job_id, j.state, j.state_version
FROM (SELECT 1) one
LEFT JOIN LATERAL (
    SELECT id, state, state_version
    FROM extraction_jobs
    WHERE tenant_id = %(tenant_id)s AND state = ANY (%(states)s)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s
) j ON true

-- name: prune_job_events
-- One batch of the oldest events, as far as they run past the retention without a younger one
-- among them, deleted with the horizon moved over them in the same statement.
WITH oldest AS (
    SELECT seq, at FROM job_events ORDER BY seq LIMIT %(batch)s
), expired AS (
    SELECT coalesce(max(seq), 0) AS through
    FROM oldest
    WHERE seq < coalesce(
        (SELECT min(seq) FROM oldest WHERE at >= now() - make_interval(secs => %(seconds)s)),
        9223372036854775807
    )
), gone AS (
    DELETE FROM job_events WHERE seq <= (SELECT through FROM expired) RETURNING seq
)
UPDATE job_event_horizon
SET pruned_through = greatest(pruned_through, (SELECT through FROM expired)), pruned_at = now()
WHERE EXISTS (SELECT 1 FROM gone)
RETURNING (SELECT count(*) FROM gone) AS deleted, pruned_through
