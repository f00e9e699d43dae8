-- Statements of the inference worker: the fair claim, fenced completions and lease heartbeats.
-- Every write to a job a worker owns is conditional on its fence.

-- name: tenant_loads
-- Tenants with eligible work, found by a skip scan of extraction_jobs_eligible_by_tenant (one
-- index probe per tenant, not a scan of the backlog), with what the fair choice needs of each.
WITH RECURSIVE t AS (
    (SELECT tenant_id FROM extraction_jobs
      WHERE state IN ('READY', 'RETRY_SCHEDULED') ORDER BY tenant_id LIMIT 1)
    UNION ALL
    SELECT (SELECT e.tenant_id FROM extraction_jobs e
             WHERE e.state IN ('READY', 'RETRY_SCHEDULED') AND e.tenant_id > t.tenant_id
             ORDER BY e.tenant_id LIMIT 1)
    FROM t WHERE t.tenant_id IS NOT NULL
)
SELECT t.tenant_id, tn.weight, tn.max_in_flight, now() AS now,
       (SELECT count(*) FROM extraction_jobs r
         WHERE r.tenant_id = t.tenant_id AND r.state = 'RUNNING') AS running,
       (SELECT min(i.available_at) FROM extraction_jobs i
         WHERE i.tenant_id = t.tenant_id AND i.priority = 'interactive'
           AND i.state IN ('READY', 'RETRY_SCHEDULED')) AS interactive_head,
       (SELECT min(b.available_at) FROM extraction_jobs b
         WHERE b.tenant_id = t.tenant_id AND b.priority = 'batch'
           AND b.state IN ('READY', 'RETRY_SCHEDULED')) AS batch_head
FROM t JOIN tenants tn ON tn.id = t.tenant_id
WHERE t.tenant_id IS NOT NULL

-- name: job_waits
-- Whether a job the ingest just took in still waits to be claimed: in a burst the slots claim from
-- this table faster than the ingest takes in the events, and a wake-up for a job already started
-- would only make a claim that finds nothing. An expression: the inbox's insert evaluates it in its
-- own statement (services/common/inbox.py, take_and_check), and a group's insert for each row it
-- inserted, its placeholders read as that row's columns (take_all_and_check).
EXISTS (SELECT 1 FROM extraction_jobs WHERE id = %(job_id)s AND state IN ('READY', 'RETRY_SCHEDULED'))

-- name: head_job
-- The tenant's next due job of the priority, locked, and the tenant's heads once it is taken (what
-- tenant_loads would read after its start: the worker keeps the loads it read, services/inference/loads.py).
-- The heads are read after the lock, once: in the locking scan's own select list they were read for
-- every row the scan passed, and SKIP LOCKED passes each due job another slot holds (in a burst,
-- eight or so per claim, two index probes each).
SELECT h.id, h.available_at, h.estimated_tokens, h.traceparent, h.fence,
       (SELECT min(i.available_at) FROM extraction_jobs i
         WHERE i.tenant_id = h.tenant_id AND i.priority = 'interactive'
           AND i.state IN ('READY', 'RETRY_SCHEDULED') AND i.id <> h.id) AS interactive_next,
       (SELECT min(b.available_at) FROM extraction_jobs b
         WHERE b.tenant_id = h.tenant_id AND b.priority = 'batch'
           AND b.state IN ('READY', 'RETRY_SCHEDULED') AND b.id <> h.id) AS batch_next
FROM (SELECT j.id, j.tenant_id, j.available_at, j.estimated_tokens, j.traceparent, j.fence
      FROM extraction_jobs j
      WHERE j.tenant_id = %(tenant_id)s AND j.priority = %(priority)s
        AND j.state IN ('READY', 'RETRY_SCHEDULED') AND j.available_at <= now()
      ORDER BY j.available_at
      LIMIT 1
      FOR UPDATE OF j SKIP LOCKED) AS h

-- name: start_job
-- Starts the locked head job, records its RUNNING event, and reads, in the same statement, what its
-- attempt needs: the document's text, the tenant's allowed currencies and the version of its master
-- suppliers (no second transaction, nor a second round trip, per job; the suppliers themselves are
-- read by tenant_suppliers only when the worker has not kept them at that version). The placeholder
-- below is the RUNNING
-- change's job event taken from "started" (services/common/uow.py, versioned_change_ctes): its
-- detail is the attempt, fence and lease the UPDATE just gave the job.
WITH started AS (
    UPDATE extraction_jobs
    SET state = 'RUNNING', state_version = state_version + 1, attempt = attempt + 1, fence = fence + 1,
        lease_until = now() + make_interval(secs => %(lease_seconds)s), claimed_by = %(worker_id)s,
        model = %(model)s, updated_at = now()
    WHERE id = %(job_id)s AND state IN ('READY', 'RETRY_SCHEDULED')
    RETURNING id, tenant_id, state, state_version, attempt, fence, lease_until, document_id,
              document_version, estimated_tokens, deadline_at, schema_version, priority, traceparent,
              jsonb_build_object('attempt', attempt, 'fence', fence, 'lease_until', lease_until) AS detail
),
{change_ctes}
SELECT s.*, d.text, t.allowed_currencies, t.suppliers_version
FROM started s
LEFT JOIN documents d ON d.tenant_id = s.tenant_id AND d.id = s.document_id AND d.version = s.document_version
LEFT JOIN tenants t ON t.id = s.tenant_id

-- name: tenant_suppliers
-- A tenant's master suppliers and the version they are at, in one statement (one snapshot); a tenant
-- with none gives one row of nulls.
SELECT t.suppliers_version, m.tax_id, m.name, m.iban, m.currency
FROM tenants t LEFT JOIN suppliers m ON m.tenant_id = t.id
WHERE t.id = %(tenant_id)s

-- name: defer_job
UPDATE extraction_jobs
SET available_at = greatest(available_at, now() + make_interval(secs => %(seconds)s)), updated_at = now()
WHERE id = %(job_id)s AND state IN ('READY', 'RETRY_SCHEDULED')

-- name: complete_job
-- The fenced completion in one statement: the row's outcome, the attempt's hops (jsonb, one object
-- per hop) and the change's job and outbox events (the placeholder below, taken from "done"). When the
-- fence is stale the UPDATE writes nothing, so neither do the events, and the hops are logged with
-- the outcome "stale"; a refunded attempt (written, refund 1) logs no hops. The last placeholders
-- are the slot's next head job, locked in the same statement when the worker knows which tenant
-- and priority its next claim will try first (services/inference/claims.py), and what is returned.
WITH done AS (
    UPDATE extraction_jobs
    SET state = %(state)s, state_version = state_version + 1, lease_until = NULL,
        attempt = attempt - %(refund)s,
        result = %(result)s, review_reasons = %(review_reasons)s, error_class = %(error_class)s,
        error_message = %(error_message)s, usage = fatura_usage_add(usage, %(usage)s),
        policy_version = coalesce(%(policy_version)s, policy_version),
        available_at = coalesce(%(available_at)s, available_at),
        finished_at = CASE WHEN %(terminal)s THEN now() END, updated_at = now(),
        decided_by = CASE WHEN %(state)s = 'SUCCEEDED' THEN 'model' END
    WHERE id = %(job_id)s AND state = 'RUNNING' AND fence = %(fence)s AND lease_until > now()
    RETURNING tenant_id, state_version, priority,
              extract(epoch FROM now() - created_at)::float8 AS since_accepted
),
hops AS (
    INSERT INTO job_attempts (job_id, attempt, fence, channel, model, started_at, ended_at, outcome,
                              http_status, error_class, retry_after_ms, input_tokens, output_tokens,
                              latency_ms, error_message, worker_id, time_to_first_token_ms,
                              inter_token_ms)
    SELECT %(job_id)s, %(attempt)s, %(fence)s, h.channel, h.model, h.started_at, h.ended_at,
           CASE WHEN w.written THEN h.outcome ELSE 'stale' END, h.http_status, h.error_class,
           h.retry_after_ms, h.input_tokens, h.output_tokens, h.latency_ms, h.error_message,
           %(worker_id)s, h.time_to_first_token_ms, h.inter_token_ms
    FROM jsonb_to_recordset(%(hops)s) AS h(
             channel text, model text, started_at timestamptz, ended_at timestamptz, outcome text,
             http_status integer, error_class text, retry_after_ms integer, input_tokens integer,
             output_tokens integer, latency_ms integer, error_message text,
             time_to_first_token_ms integer, inter_token_ms real)
    CROSS JOIN (SELECT EXISTS (SELECT FROM done) AS written) w
    WHERE NOT (w.written AND %(refund)s = 1)
),
{change_ctes}{next_head}
{returning}

-- name: open_review_task
-- A result that did not pass validation waits for a reviewer (DESIGN §5.13): its task is opened
-- in the completion's transaction, with the audit trail's first line.
WITH task AS (
    INSERT INTO review_tasks (id, tenant_id, job_id, kind, reasons, job_version)
    VALUES (%(task_id)s, %(tenant_id)s, %(job_id)s, 'validation', %(reasons)s, %(job_version)s)
    ON CONFLICT DO NOTHING
    RETURNING id, tenant_id
)
INSERT INTO review_task_events (task_id, tenant_id, actor, action, detail)
SELECT id, tenant_id, 'fatura', 'opened', %(detail)s FROM task

-- name: renew_leases
UPDATE extraction_jobs j
SET lease_until = now() + make_interval(secs => %(lease_seconds)s)
FROM unnest(%(job_ids)s::uuid[], %(fences)s::bigint[]) AS h(id, fence)
WHERE j.id = h.id AND j.fence = h.fence AND j.state = 'RUNNING' AND j.lease_until > now()
RETURNING j.id

-- name: refuse_job
-- The limiter says no wait could ever admit the job (its document and answer are bigger than the
-- pool's whole KV cache or TPM): it fails at once instead of being deferred for ever.
UPDATE extraction_jobs
SET state = 'FAILED_TERMINAL', state_version = state_version + 1, error_class = %(error_class)s,
    error_message = %(error_message)s, finished_at = now(), updated_at = now()
WHERE id = %(job_id)s AND state IN ('READY', 'RETRY_SCHEDULED')
RETURNING tenant_id, state_version, priority,
          extract(epoch FROM now() - created_at)::float8 AS since_accepted
