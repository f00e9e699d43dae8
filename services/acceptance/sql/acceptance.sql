-- Queries of the acceptance edge. Parameters always go through placeholders.

-- name: admission_lock
-- The tenant's admission lock, held to the end of the transaction: a request deciding on fresh
-- counters reads, decides and writes while no other such request of the tenant can (the two-key
-- form, in a namespace of its own: 7001 is admission).
SELECT pg_advisory_xact_lock(7001, hashtext(%(tenant_id)s::text))

-- name: admission_snapshot
-- One round trip: the job already holding this idempotency key (if any), the referenced document
-- (if any), and the admission counters (at most 16 shard rows per scope).
SELECT
    (SELECT to_jsonb(j) FROM (
        SELECT id, state, state_version, request_hash, priority, created_at
        FROM extraction_jobs
        WHERE tenant_id = %(tenant_id)s AND idempotency_key = %(idempotency_key)s) j) AS existing,
    (SELECT to_jsonb(d) FROM (
        SELECT size_bytes, sha256
        FROM documents
        WHERE tenant_id = %(tenant_id)s AND id = %(document_id)s AND version = %(document_version)s) d)
        AS document,
    t.pending_jobs, t.pending_bytes, t.pending_tokens,
    s.pending_jobs AS system_pending_jobs,
    d.tokens AS tokens_today
FROM (SELECT coalesce(sum(pending_jobs), 0)::bigint AS pending_jobs,
             coalesce(sum(pending_bytes), 0)::bigint AS pending_bytes,
             coalesce(sum(pending_tokens), 0)::bigint AS pending_tokens
      FROM admission_counters WHERE scope = %(tenant_id)s) t,
     (SELECT coalesce(sum(pending_jobs), 0)::bigint AS pending_jobs
      FROM admission_counters WHERE scope = '00000000-0000-0000-0000-000000000000') s,
     (SELECT coalesce(sum(tokens), 0)::bigint AS tokens
      FROM daily_token_usage
      WHERE tenant_id = %(tenant_id)s AND day = (now() AT TIME ZONE 'UTC')::date) d

-- name: admission_counters
-- The tenant's admission counters alone (as admission_snapshot reads them), for the fast path.
SELECT t.pending_jobs, t.pending_bytes, t.pending_tokens,
       s.pending_jobs AS system_pending_jobs,
       d.tokens AS tokens_today
FROM (SELECT coalesce(sum(pending_jobs), 0)::bigint AS pending_jobs,
             coalesce(sum(pending_bytes), 0)::bigint AS pending_bytes,
             coalesce(sum(pending_tokens), 0)::bigint AS pending_tokens
      FROM admission_counters WHERE scope = %(tenant_id)s) t,
     (SELECT coalesce(sum(pending_jobs), 0)::bigint AS pending_jobs
      FROM admission_counters WHERE scope = '00000000-0000-0000-0000-000000000000') s,
     (SELECT coalesce(sum(tokens), 0)::bigint AS tokens
      FROM daily_token_usage
      WHERE tenant_id = %(tenant_id)s AND day = (now() AT TIME ZONE 'UTC')::date) d

-- name: insert_document
INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, filename, text)
VALUES (%(tenant_id)s, %(document_id)s, 1, %(sha256)s, %(size_bytes)s, %(filename)s, %(text)s)
RETURNING id, version, sha256, size_bytes, filename

-- name: insert_document_version
-- A new version of an existing document; returns nothing when the document does not exist.
INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, filename, text)
SELECT %(tenant_id)s, %(document_id)s, max(version) + 1, %(sha256)s, %(size_bytes)s,
       coalesce(%(filename)s, (array_agg(filename ORDER BY version DESC))[1]), %(text)s
FROM documents
WHERE tenant_id = %(tenant_id)s AND id = %(document_id)s
HAVING count(*) > 0
RETURNING id, version, sha256, size_bytes, filename

-- name: accept_job
-- The whole acceptance as one atomic statement. The job row is inserted unless a request with the
-- same idempotency key came first; the inline document, the job event and the outbox event are
-- inserted only together with it (they select from `job`), so a replay or a conflict writes
-- nothing. The foreign key from the job to its document is checked at the end of the statement.
-- The marker after `document` is replaced by the job event and the outbox event, as the unit of
-- work writes them (services/common/uow.py ``change_ctes``), selecting from `job`. A batch runs this
-- same statement once per item, in one transaction per chunk (services/acceptance/batches.py).
WITH job AS (
    INSERT INTO extraction_jobs (
        id, tenant_id, idempotency_key, request_hash, document_id, document_version, object_version,
        doc_bytes, estimated_tokens, schema_version, policy_version, model_policy, options, priority,
        state, state_version, deadline_at, batch_id, batch_index, traceparent)
    VALUES (
        %(job_id)s, %(tenant_id)s, %(idempotency_key)s, %(request_hash)s, %(document_id)s,
        %(document_version)s, %(sha256)s, %(size_bytes)s, %(estimated_tokens)s,
        %(schema_version)s, %(policy_version)s, %(model_policy)s, %(options)s, %(priority)s,
        %(state)s, %(state_version)s, now() + make_interval(secs => %(deadline_seconds)s),
        %(batch_id)s, %(batch_index)s, %(traceparent)s)
    ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
    RETURNING id, state, state_version, request_hash, priority, created_at
), document AS (
    INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, filename, text)
    SELECT %(tenant_id)s, %(document_id)s, 1, %(sha256)s, %(size_bytes)s, %(filename)s, %(text)s
    FROM job
    WHERE %(inline)s
    ON CONFLICT (tenant_id, id, version) DO NOTHING
), {change_ctes}
SELECT id, state, state_version, request_hash, priority, created_at FROM job

-- name: job_by_key
SELECT id, state, state_version, request_hash, priority, created_at
FROM extraction_jobs
WHERE tenant_id = %(tenant_id)s AND idempotency_key = %(idempotency_key)s

-- name: get_job
SELECT id, tenant_id, state, state_version, attempt, priority, document_id, document_version,
       schema_version, policy_version, available_at, deadline_at, error_class, error_message,
       review_reasons, result_ref, result, usage, created_at, updated_at, finished_at, decided_by,
       correction, erp, now() AS now,
       (SELECT r.id FROM review_tasks r
        WHERE r.job_id = j.id AND r.state IN ('open', 'claimed')
        ORDER BY r.created_at DESC LIMIT 1) AS review_id
FROM extraction_jobs j
WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s

-- name: list_jobs
SELECT id, state, state_version, priority, created_at, updated_at
FROM extraction_jobs
WHERE tenant_id = %(tenant_id)s
  AND (created_at, id) < (%(before_created_at)s, %(before_id)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: list_jobs_in_state
SELECT id, state, state_version, priority, created_at, updated_at
FROM extraction_jobs
WHERE tenant_id = %(tenant_id)s AND state = %(state)s
  AND (created_at, id) < (%(before_created_at)s, %(before_id)s)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s

-- name: cancel_job
-- A job cancelled while RUNNING keeps the cost of the call in flight (it may be billed): its usage
-- is unknown, so the whole reservation (estimated_tokens) is added to the job's usage.
UPDATE extraction_jobs
SET state = 'CANCELLED', state_version = state_version + 1, lease_until = NULL,
    updated_at = now(), finished_at = now(),
    usage = CASE WHEN state = 'RUNNING'
                 THEN fatura_usage_add(usage, jsonb_build_object('total_tokens', estimated_tokens,
                                                                 'estimated_tokens', estimated_tokens))
                 ELSE usage END
WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s
  AND state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')
RETURNING id, tenant_id, state, state_version, priority,
          extract(epoch FROM now() - created_at)::float8 AS since_accepted

-- name: create_tenant
INSERT INTO tenants (id, name, weight, max_in_flight, max_pending_jobs, max_pending_bytes,
                     max_pending_tokens, daily_token_budget, max_stored_bytes, allowed_currencies)
VALUES (%(id)s, %(name)s, %(weight)s, %(max_in_flight)s, %(max_pending_jobs)s,
        %(max_pending_bytes)s, %(max_pending_tokens)s, %(daily_token_budget)s, %(max_stored_bytes)s,
        %(allowed_currencies)s)

-- name: stored_bytes
SELECT coalesce(sum(bytes), 0)::bigint AS bytes FROM document_usage WHERE tenant_id = %(tenant_id)s

-- name: prune_documents
-- Documents no job references, older than the retention, in bounded batches. A job that starts
-- referencing one meanwhile makes the foreign key refuse the batch; the next pass tries again.
DELETE FROM documents d
WHERE (d.tenant_id, d.id, d.version) IN (
    SELECT o.tenant_id, o.id, o.version FROM documents o
    WHERE o.created_at < now() - %(days)s::float8 * interval '1 day'
      AND NOT EXISTS (SELECT 1 FROM extraction_jobs j
                      WHERE j.tenant_id = o.tenant_id AND j.document_id = o.id
                        AND j.document_version = o.version)
    ORDER BY o.created_at
    LIMIT %(batch)s)
RETURNING d.size_bytes

-- name: create_api_key
INSERT INTO api_keys (id, tenant_id, prefix, secret_hash)
VALUES (%(id)s, %(tenant_id)s, %(prefix)s, %(secret_hash)s)

-- name: create_scoped_api_key
-- Returns nothing when the tenant does not exist (an operator key names none).
INSERT INTO api_keys (id, tenant_id, prefix, secret_hash, scope, label)
SELECT %(id)s, %(tenant_id)s::uuid, %(prefix)s, %(secret_hash)s, %(scope)s, %(label)s
WHERE %(tenant_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM tenants WHERE id = %(tenant_id)s::uuid)
RETURNING prefix, scope, label, tenant_id, created_at, revoked_at

-- name: list_api_keys
-- Never the hash; a tenant's keys, the operator keys, or every key.
SELECT prefix, scope, label, tenant_id, created_at, revoked_at
FROM api_keys
WHERE (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (NOT %(operator)s OR scope = 'operator')
ORDER BY created_at, prefix

-- name: revoke_api_key
-- Revoking twice keeps the first time; a revocation scheduled by a rotation is brought forward.
UPDATE api_keys SET revoked_at = least(coalesce(revoked_at, now()), now())
WHERE prefix = %(prefix)s
RETURNING prefix, scope, label, tenant_id, created_at, revoked_at

-- name: rotate_api_key
-- The old key stays valid for the grace period, then is revoked (a revocation in the future takes
-- effect when it comes); a key already revoked cannot be rotated.
UPDATE api_keys
SET revoked_at = now() + make_interval(secs => %(grace_seconds)s)
WHERE prefix = %(prefix)s AND (revoked_at IS NULL OR revoked_at > now())
RETURNING prefix, scope, label, tenant_id, created_at, revoked_at

-- name: tenant_exists
SELECT 1 FROM tenants WHERE id = %(tenant_id)s

-- name: upsert_supplier
INSERT INTO suppliers (tenant_id, tax_id, name, iban, currency)
VALUES (%(tenant_id)s, %(tax_id)s, %(name)s, %(iban)s, %(currency)s)
ON CONFLICT (tenant_id, tax_id) DO UPDATE
    SET name = EXCLUDED.name, iban = EXCLUDED.iban, currency = EXCLUDED.currency, updated_at = now()

-- name: ping
SELECT 1 AS ok
