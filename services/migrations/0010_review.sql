-- Review is a human decision (DESIGN §3, §5.13): a REVIEW_REQUIRED job waits for a reviewer, who
-- approves it (SUCCEEDED, decided by a reviewer), corrects it (re-validated, then SUCCEEDED) or
-- rejects it (REJECTED, terminal). An ERP's signed acknowledgement of a delivery is the business
-- outcome; a `rejected` one opens a review task of its own.

-- REJECTED: a reviewer's refusal. The two ways out of REVIEW_REQUIRED are a reviewer's decisions.
ALTER TABLE extraction_jobs DROP CONSTRAINT extraction_jobs_state_check;
ALTER TABLE extraction_jobs ADD CONSTRAINT extraction_jobs_state_check CHECK (state IN
    ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL',
     'CANCELLED', 'REJECTED'));
INSERT INTO job_state_transitions (from_state, to_state) VALUES
    ('REVIEW_REQUIRED', 'SUCCEEDED'), ('REVIEW_REQUIRED', 'REJECTED');

ALTER TABLE extraction_jobs
    -- Who decided the current result: the model (validation passed) or a reviewer.
    ADD COLUMN decided_by  text CHECK (decided_by IN ('model', 'reviewer')),
    -- A reviewer's correction, beside the model's: {model_result, changes, reviewer, at}.
    ADD COLUMN correction  jsonb,
    -- The ERP's latest business acknowledgement: {delivery_id, received_at, outcome, reason, at}.
    ADD COLUMN erp         jsonb;

-- Job events that are not state changes (a review closed without one, an ERP acknowledgement)
-- sit in the same log; one state event per state_version still holds.
ALTER TABLE job_events
    ADD COLUMN kind text NOT NULL DEFAULT 'state' CHECK (kind IN ('state', 'review', 'erp_ack'));
ALTER TABLE job_events DROP CONSTRAINT job_events_job_id_state_version_key;
CREATE UNIQUE INDEX job_events_one_per_version ON job_events (job_id, state_version) WHERE kind = 'state';

-- One task per cause: a validation that did not pass (at the job's version), or one delivery an
-- ERP refused. A task is claimed under a fence, like a worker's lease: a decision is written only
-- by the claim's owner, under the claim's fence, before the claim expires.
CREATE TABLE review_tasks (
    id             uuid PRIMARY KEY,
    tenant_id      uuid NOT NULL REFERENCES tenants (id),
    job_id         uuid NOT NULL REFERENCES extraction_jobs (id),
    kind           text NOT NULL CHECK (kind IN ('validation', 'erp_rejected')),
    state          text NOT NULL DEFAULT 'open'
                     CHECK (state IN ('open', 'claimed', 'approved', 'corrected', 'rejected')),
    reasons        jsonb NOT NULL,
    job_version    integer NOT NULL,
    delivery_id    uuid,
    owner          text,
    owner_label    text,
    fence          bigint NOT NULL DEFAULT 0,
    claimed_until  timestamptz,
    decision       jsonb,
    decided_at     timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    UNIQUE NULLS NOT DISTINCT (job_id, kind, job_version, delivery_id)
);

CREATE INDEX review_tasks_queue ON review_tasks (tenant_id, state, created_at, id);
CREATE INDEX review_tasks_by_job ON review_tasks (job_id);

-- The audit trail: every open, claim, release and decision, by whom, under which fence.
CREATE TABLE review_task_events (
    seq        bigserial PRIMARY KEY,
    task_id    uuid NOT NULL REFERENCES review_tasks (id),
    tenant_id  uuid NOT NULL,
    at         timestamptz NOT NULL DEFAULT now(),
    actor      text NOT NULL,
    action     text NOT NULL CHECK (action IN
                 ('opened', 'claimed', 'released', 'approved', 'corrected', 'rejected', 'refused')),
    fence      bigint,
    detail     jsonb
);

CREATE INDEX review_task_events_by_task ON review_task_events (task_id, seq);

-- The ERP's business acknowledgement of one delivery (signed with the endpoint's secret).
ALTER TABLE deliveries
    ADD COLUMN ack_outcome  text CHECK (ack_outcome IN ('posted', 'rejected')),
    ADD COLUMN ack_reason   text,
    ADD COLUMN acked_at     timestamptz;

CREATE INDEX deliveries_unacknowledged ON deliveries (tenant_id, delivered_at)
    WHERE state = 'delivered' AND acked_at IS NULL;

-- Grants under the service roles of 0007. The edge serves the review API and the acknowledgement
-- route; the inference worker opens tasks when validation does not pass.
GRANT SELECT, INSERT, UPDATE ON review_tasks TO fatura_edge;
GRANT SELECT, INSERT ON review_task_events TO fatura_edge;
GRANT SELECT ON suppliers TO fatura_edge;
GRANT USAGE ON SEQUENCE review_task_events_seq_seq TO fatura_edge;
GRANT SELECT, INSERT ON review_tasks, review_task_events TO fatura_inference;
GRANT USAGE ON SEQUENCE review_task_events_seq_seq TO fatura_inference;
GRANT SELECT ON review_tasks TO fatura_delivery;

-- A REVIEW_REQUIRED result is no longer an ERP event: endpoints that took the old event type take
-- `extraction.rejected.v1` instead, and an unpublished old event becomes the review request it
-- now is (its body is built from ids, never from the unvalidated fields).
UPDATE webhook_endpoints
SET event_types = array_remove(event_types, 'extraction.review_required.v1')
                  || CASE WHEN 'extraction.rejected.v1' = ANY (event_types) THEN '{}'::text[]
                          ELSE '{extraction.rejected.v1}'::text[] END,
    updated_at = now()
WHERE 'extraction.review_required.v1' = ANY (event_types);
UPDATE outbox_events
SET event_type = 'review.requested.v1',
    payload = jsonb_set(payload, '{event_type}', '"review.requested.v1"')
WHERE event_type = 'extraction.review_required.v1' AND published_at IS NULL;
