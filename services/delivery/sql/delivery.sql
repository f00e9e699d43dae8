-- Queries of the delivery worker and scheduler. Parameters always go through placeholders.
-- Lock order, everywhere: an endpoint row before its delivery rows.

-- name: job_for_event
-- The job row as JSON (so columns other services add, such as `result`, come along), and when and
-- in which state the job reached the event's state version.
-- A review request also names its review task.
SELECT to_jsonb(j) AS job, e.at AS occurred_at, e.state AS recorded_state,
       (SELECT r.id FROM review_tasks r
        WHERE r.job_id = j.id AND r.job_version = %(state_version)s AND r.kind = 'validation') AS review_id
FROM extraction_jobs j
LEFT JOIN job_events e ON e.job_id = j.id AND e.state_version = %(state_version)s AND e.kind = 'state'
WHERE j.id = %(job_id)s

-- name: matching_endpoints
SELECT id, state FROM webhook_endpoints
WHERE tenant_id = %(tenant_id)s AND %(event_type)s = ANY (event_types)
ORDER BY created_at

-- name: insert_delivery
-- A delivery to a disabled endpoint is created already failed, so `:recover` can send it later.
INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, job_id, body,
                        state, reason, woken_at, traceparent)
VALUES (%(delivery_id)s, %(event_id)s, %(event_type)s, %(endpoint_id)s, %(tenant_id)s, %(job_id)s,
        %(body)s, %(state)s, %(reason)s, now(), %(traceparent)s)
ON CONFLICT (delivery_id) DO NOTHING
RETURNING delivery_id, state

-- name: lock_endpoint_of
-- Claims of one endpoint take turns on its row. The lock is its own statement: a statement's
-- snapshot is taken before it waits for a lock, so a count read in the same statement would miss
-- the claims committed meanwhile, and the concurrency cap would leak. A delivery that is not
-- pending and due (a wake-up for one a batch already took) takes no lock: there is nothing to do.
SELECT e.id FROM webhook_endpoints e
WHERE e.id = (SELECT endpoint_id FROM deliveries
              WHERE delivery_id = %(delivery_id)s AND state = 'pending' AND next_attempt_at <= now())
FOR UPDATE

-- name: claim_context
-- Read under the endpoint's lock, with a fresh snapshot: the in-flight count is exact.
SELECT d.state, d.next_attempt_at <= now() AS due,
       e.id AS endpoint_id, e.url, e.state AS endpoint_state, e.max_concurrency, e.breaker_open_until,
       coalesce(e.breaker_open_until > now(), false) AS breaker_open,
       (e.consecutive_failures <> 0 OR e.consecutive_auth_failures <> 0 OR e.verified_at IS NULL
        OR e.breaker_open_until IS NOT NULL) AS endpoint_dirty,
       -- Requests that can be open at once: a batch is sent one delivery after another.
       (SELECT count(DISTINCT coalesce(f.sender, f.delivery_id)) FROM deliveries f
        WHERE f.endpoint_id = e.id AND f.state = 'delivering' AND f.lease_until > now()) AS in_flight,
       -- Sealed (services/common/keyring.py); the worker opens them to sign.
       coalesce((SELECT jsonb_agg(jsonb_build_object(
                     'key_id', s.key_id, 'master_key_id', s.master_key_id,
                     'nonce', encode(s.nonce, 'base64'), 'ciphertext', encode(s.ciphertext, 'base64'))
                     ORDER BY s.created_at DESC)
                 FROM webhook_secrets s
                 WHERE s.endpoint_id = e.id AND (s.not_after IS NULL OR s.not_after > now())),
                '[]'::jsonb) AS secrets
FROM deliveries d
JOIN webhook_endpoints e ON e.id = d.endpoint_id
WHERE d.delivery_id = %(delivery_id)s

-- name: claim
-- Under the endpoint's lock and within its cap: the woken delivery and up to %(more)s others due
-- to the same endpoint, which the same sender (named by the woken delivery's id) sends one after
-- another over its kept-alive connection; their own wake-ups then find nothing to do. Each row
-- is conditional: a resend or the scheduler may have changed it since it was read.
-- The ids are gathered into an array first: with `IN (subquery)`, statistics older than a burst
-- (they said no delivery was pending) led PostgreSQL to walk every due delivery and re-run the
-- subquery for each one, 1.9 s per claim at 6,000 due, under the endpoint's lock.
WITH named AS (
    SELECT delivery_id FROM deliveries
    WHERE delivery_id = %(delivery_id)s AND state = 'pending' AND next_attempt_at <= now()
), more AS (
    SELECT delivery_id FROM deliveries
    WHERE endpoint_id = %(endpoint_id)s AND state = 'pending' AND next_attempt_at <= now()
      AND delivery_id <> %(delivery_id)s
    ORDER BY next_attempt_at
    LIMIT %(more)s
    FOR UPDATE SKIP LOCKED
)
UPDATE deliveries d
SET state = 'delivering', fence = d.fence + 1, attempts = d.attempts + 1, sender = %(delivery_id)s,
    lease_until = now() + make_interval(secs => %(lease_seconds)s), updated_at = now()
WHERE d.delivery_id = ANY (ARRAY(SELECT delivery_id FROM named UNION ALL SELECT delivery_id FROM more))
  AND d.state = 'pending' AND d.next_attempt_at <= now()
RETURNING d.delivery_id, d.body, d.traceparent, d.fence, d.attempts, d.attempts_base,
          now() AS started_at

-- name: release_unsent
-- Claimed in a batch and not sent (an earlier delivery of the batch did not get through): due
-- again at once, under the fence that claimed it, without spending an attempt.
UPDATE deliveries d
SET state = 'pending', attempts = d.attempts - 1, lease_until = NULL, next_attempt_at = now(),
    woken_at = NULL, updated_at = now()
FROM unnest(%(delivery_ids)s::uuid[], %(fences)s::bigint[]) AS u(delivery_id, fence)
WHERE d.delivery_id = u.delivery_id AND d.fence = u.fence AND d.state = 'delivering'

-- name: postpone
-- Not an attempt: the endpoint's breaker is open or it is at its concurrency cap.
UPDATE deliveries
SET next_attempt_at = now() + make_interval(secs => %(delay_seconds)s), woken_at = NULL,
    reason = %(reason)s, updated_at = now()
WHERE delivery_id = %(delivery_id)s

-- name: fail_unsendable
UPDATE deliveries
SET state = 'failed', reason = %(reason)s, updated_at = now(), woken_at = NULL
WHERE delivery_id = %(delivery_id)s AND state = 'pending'

-- name: record_attempt
-- The outcome is written only under the fence that claimed it (a sender whose lease ran out
-- changes nothing); the attempt is logged either way, as `stale` when the claim was lost.
WITH outcome AS (
    UPDATE deliveries
    SET state = %(state)s::text, reason = %(reason)s, last_status = %(http_status)s::integer,
        next_attempt_at = now() + make_interval(secs => %(delay_seconds)s),
        lease_until = NULL, woken_at = NULL, updated_at = now(),
        delivered_at = CASE WHEN %(state)s::text = 'delivered' THEN now() ELSE delivered_at END
    WHERE delivery_id = %(delivery_id)s AND fence = %(fence)s AND state = 'delivering'
    RETURNING delivery_id
)
INSERT INTO delivery_attempts (delivery_id, attempt, fence, started_at, outcome, http_status,
                               error_class, response_body, retry_after_ms, latency_ms)
SELECT %(delivery_id)s::uuid, %(attempt)s::integer, %(fence)s::bigint, %(started_at)s::timestamptz,
       CASE WHEN EXISTS (SELECT 1 FROM outcome) THEN %(state)s::text ELSE 'stale' END,
       %(http_status)s::integer, %(error_class)s::text, %(response_body)s::text,
       %(retry_after_ms)s::bigint, %(latency_ms)s::integer
RETURNING outcome

-- name: endpoint_healthy
-- Written only when something changes, so a healthy endpoint's row is not rewritten per delivery.
UPDATE webhook_endpoints
SET consecutive_failures = 0, consecutive_auth_failures = 0, breaker_open_until = NULL,
    verified_at = coalesce(verified_at, now()), updated_at = now()
WHERE id = %(endpoint_id)s
  AND (consecutive_failures <> 0 OR consecutive_auth_failures <> 0 OR verified_at IS NULL
       OR breaker_open_until IS NOT NULL)

-- name: endpoint_failure
-- One more consecutive failure; the breaker opens when they reach the threshold.
UPDATE webhook_endpoints
SET consecutive_failures = consecutive_failures + 1,
    breaker_open_until = CASE WHEN consecutive_failures + 1 >= %(threshold)s
                              THEN now() + make_interval(secs => %(cooldown_seconds)s)
                              ELSE breaker_open_until END,
    updated_at = now()
WHERE id = %(endpoint_id)s
RETURNING consecutive_failures, breaker_open_until

-- name: endpoint_auth_failure
UPDATE webhook_endpoints
SET consecutive_auth_failures = consecutive_auth_failures + 1,
    state = CASE WHEN consecutive_auth_failures + 1 >= %(limit)s THEN 'disabled' ELSE state END,
    disabled_reason = CASE WHEN consecutive_auth_failures + 1 >= %(limit)s AND state = 'enabled'
                           THEN %(reason)s ELSE disabled_reason END,
    disabled_at = CASE WHEN consecutive_auth_failures + 1 >= %(limit)s AND state = 'enabled'
                       THEN now() ELSE disabled_at END,
    updated_at = now()
WHERE id = %(endpoint_id)s
RETURNING consecutive_auth_failures, state

-- name: endpoint_disable
UPDATE webhook_endpoints
SET state = 'disabled', disabled_reason = %(reason)s, disabled_at = now(), updated_at = now()
WHERE id = %(endpoint_id)s AND state = 'enabled'
RETURNING id

-- name: expire_leases
-- Senders that died holding a claim: the delivery becomes due again (or dead when its attempts
-- are spent). The lost attempt is logged with outcome `lost`: the POST may have been made.
WITH expired AS (
    UPDATE deliveries
    SET state = CASE WHEN attempts - attempts_base >= %(max_attempts)s THEN 'dead' ELSE 'pending' END,
        reason = 'the sender stopped before recording its attempt (lease expired)',
        lease_until = NULL, next_attempt_at = now(), woken_at = NULL, updated_at = now()
    WHERE delivery_id IN (
        SELECT delivery_id FROM deliveries
        WHERE state = 'delivering' AND lease_until < now()
        ORDER BY lease_until
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED)
    RETURNING delivery_id, attempts, fence, updated_at
)
INSERT INTO delivery_attempts (delivery_id, attempt, fence, started_at, outcome, error_class)
SELECT delivery_id, attempts, fence, updated_at, 'lost', 'lease_expired' FROM expired
RETURNING delivery_id

-- name: due_wakeups
-- Due deliveries nobody has been woken for lately; marks them woken. `rewoken`: one was woken
-- before and still is not sent (its wake-up was lost, or its sender died): a re-drive.
WITH due AS (
    SELECT delivery_id, woken_at FROM deliveries
    WHERE state = 'pending' AND next_attempt_at <= now()
      AND (woken_at IS NULL OR woken_at < now() - make_interval(secs => %(rewake_seconds)s))
    ORDER BY next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
UPDATE deliveries d
SET woken_at = now()
FROM due
WHERE d.delivery_id = due.delivery_id
RETURNING d.delivery_id, d.endpoint_id, due.woken_at IS NOT NULL AS rewoken

-- name: backlog
SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= now()) AS due,
       count(*) FILTER (WHERE state = 'delivering') AS delivering,
       coalesce(extract(epoch FROM now() - min(next_attempt_at) FILTER (
           WHERE state = 'pending' AND next_attempt_at <= now())), 0)::float8 AS oldest_due_age_seconds
FROM deliveries
WHERE state IN ('pending', 'delivering')

-- name: unacknowledged
-- Deliveries received longer ago than the window and not acknowledged by the ERP, across tenants,
-- counted up to a cap so the pass stays bounded however many an ERP leaves unacknowledged.
SELECT count(*) AS n
FROM (SELECT 1 FROM deliveries
      WHERE state = 'delivered' AND acked_at IS NULL AND event_type = ANY (%(event_types)s)
        AND delivered_at < now() - make_interval(secs => %(window_seconds)s)
      LIMIT %(cap)s) overdue

-- name: batch_for_event
-- A batch event's batch (migration 0013) and its counts: at most 16 counter rows.
SELECT b.id, b.tenant_id, b.state, b.total, b.completed_at,
       coalesce(sum(c.succeeded), 0)::integer AS succeeded,
       coalesce(sum(c.failed), 0)::integer AS failed,
       coalesce(sum(c.rejected), 0)::integer AS rejected,
       coalesce(sum(c.cancelled), 0)::integer AS cancelled
FROM extraction_batches b
LEFT JOIN batch_counters c ON c.batch_id = b.id
WHERE b.id = %(batch_id)s
GROUP BY b.id

-- name: endpoint_states
-- How many endpoints are in each breaker state, across tenants: a bounded series per state where
-- a label per endpoint would be unbounded (the operator API lists each endpoint's health).
SELECT count(*) FILTER (WHERE state = 'disabled') AS disabled,
       count(*) FILTER (WHERE state = 'enabled' AND breaker_open_until > now()) AS open,
       count(*) FILTER (WHERE state = 'enabled' AND (breaker_open_until IS NULL
                                                     OR breaker_open_until <= now())) AS closed
FROM webhook_endpoints
