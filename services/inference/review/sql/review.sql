-- The review workflow (DESIGN §5.13). Every statement is scoped to the reviewer's tenant. A
-- decision is fenced like a worker's completion: written only by the claim's owner, under the
-- claim's fence, before the claim runs out.

-- name: list_reviews
SELECT r.id, r.job_id, r.kind, r.state, r.reasons, r.owner_label, r.claimed_until, r.created_at,
       r.decided_at, now() AS now
FROM review_tasks r
WHERE r.tenant_id = %(tenant_id)s
  AND (%(state)s::text IS NULL OR r.state = %(state)s
       OR (%(state)s = 'open' AND r.state = 'claimed' AND r.claimed_until <= now())
       OR (%(state)s = 'decided' AND r.state IN ('approved', 'corrected', 'rejected')))
  AND (r.created_at, r.id) > (%(after_created_at)s, %(after_id)s)
ORDER BY r.created_at, r.id
LIMIT %(limit)s

-- name: get_review
SELECT r.id, r.job_id, r.kind, r.state, r.reasons, r.job_version, r.delivery_id, r.owner,
       r.owner_label, r.fence, r.claimed_until, r.decision, r.decided_at, r.created_at, now() AS now,
       j.state AS job_state, j.state_version AS job_state_version, j.result, j.policy_version,
       j.document_id, j.document_version, j.correction, d.text AS document_text
FROM review_tasks r
JOIN extraction_jobs j ON j.id = r.job_id
JOIN documents d ON d.tenant_id = j.tenant_id AND d.id = j.document_id AND d.version = j.document_version
WHERE r.id = %(review_id)s AND r.tenant_id = %(tenant_id)s

-- name: review_history
SELECT seq, at, actor, action, fence, detail
FROM review_task_events
WHERE task_id = %(review_id)s
ORDER BY seq

-- name: claim_review
-- Open, or claimed by nobody any more (the claim ran out), or already this reviewer's (renewed):
-- the claim takes a new fence, so a decision under an older claim is refused.
UPDATE review_tasks
SET state = 'claimed', owner = %(owner)s, owner_label = %(owner_label)s, fence = fence + 1,
    claimed_until = now() + make_interval(secs => %(claim_seconds)s), updated_at = now()
WHERE id = %(review_id)s AND tenant_id = %(tenant_id)s
  AND (state = 'open'
       OR (state = 'claimed' AND (claimed_until <= now() OR owner = %(owner)s)))
RETURNING id, fence, claimed_until

-- name: lock_review
SELECT id, job_id, kind, state, owner, owner_label, fence, claimed_until, job_version, delivery_id,
       claimed_until > now() AS claim_live
FROM review_tasks
WHERE id = %(review_id)s AND tenant_id = %(tenant_id)s
FOR UPDATE

-- name: decide_review
UPDATE review_tasks
SET state = %(state)s, decision = %(decision)s, decided_at = now(), claimed_until = NULL,
    updated_at = now()
WHERE id = %(review_id)s AND state = 'claimed' AND owner = %(owner)s AND fence = %(fence)s
  AND claimed_until > now()
RETURNING id

-- name: audit
INSERT INTO review_task_events (task_id, tenant_id, actor, action, fence, detail)
VALUES (%(review_id)s, %(tenant_id)s, %(actor)s, %(action)s, %(fence)s, %(detail)s)

-- name: job_for_decision
SELECT j.id, j.state, j.state_version, j.result, j.tenant_id, d.text AS document_text,
       t.allowed_currencies, j.priority,
       extract(epoch FROM now() - j.created_at)::float8 AS since_accepted
FROM extraction_jobs j
JOIN documents d ON d.tenant_id = j.tenant_id AND d.id = j.document_id AND d.version = j.document_version
JOIN tenants t ON t.id = j.tenant_id
WHERE j.id = %(job_id)s AND j.tenant_id = %(tenant_id)s
FOR UPDATE OF j

-- name: tenant_suppliers
SELECT tax_id, name, iban, currency FROM suppliers WHERE tenant_id = %(tenant_id)s

-- name: job_succeeds
-- A reviewer's approval or correction of a job awaiting review, or a correction of a delivered
-- result an ERP refused: a new state version, delivered like any success.
UPDATE extraction_jobs
SET state = 'SUCCEEDED', state_version = state_version + 1, decided_by = 'reviewer',
    result = %(result)s, correction = %(correction)s, updated_at = now(),
    finished_at = coalesce(finished_at, now())
WHERE id = %(job_id)s AND state = %(from_state)s AND state_version = %(state_version)s
RETURNING state_version

-- name: job_rejected
UPDATE extraction_jobs
SET state = 'REJECTED', state_version = state_version + 1, decided_by = 'reviewer',
    error_class = 'review_rejected', error_message = %(reason)s, updated_at = now()
WHERE id = %(job_id)s AND state = 'REVIEW_REQUIRED' AND state_version = %(state_version)s
RETURNING state_version

-- name: review_job_event
-- A decision that changes no state (an ERP's refusal closed without a new result) is still in the
-- job's history.
INSERT INTO job_events (tenant_id, job_id, state, state_version, detail, kind)
SELECT tenant_id, id, state, state_version, %(detail)s, 'review'
FROM extraction_jobs WHERE id = %(job_id)s
