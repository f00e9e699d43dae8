-- Inference execution: the execution inbox (dedup of delivered events), its quarantine, the
-- dead-letter log for refused broker messages, the extraction result, and the indexes the fair
-- claim reads.

ALTER TABLE extraction_jobs
    ADD COLUMN result      jsonb,
    ADD COLUMN model       text,
    ADD COLUMN claimed_by  text;

-- The fair claim walks tenants with eligible work (a skip scan over this index) and takes each
-- tenant's oldest eligible job of each priority.
CREATE INDEX extraction_jobs_eligible_by_tenant
    ON extraction_jobs (tenant_id, priority, available_at)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
CREATE INDEX extraction_jobs_running_by_tenant
    ON extraction_jobs (tenant_id)
    WHERE state = 'RUNNING';
CREATE INDEX extraction_jobs_deadlines
    ON extraction_jobs (deadline_at)
    WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED');

CREATE TABLE execution_inbox (
    event_id        uuid PRIMARY KEY,
    job_id          uuid NOT NULL,
    event_type      text NOT NULL,
    payload_digest  text NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- An event id seen again with a different payload: kept for an operator, never applied.
CREATE TABLE execution_inbox_quarantine (
    id              bigserial PRIMARY KEY,
    event_id        uuid NOT NULL,
    stored_digest   text NOT NULL,
    received_digest text NOT NULL,
    payload         jsonb NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- Broker messages a consumer refused (malformed, unknown version, oversized): why, and what.
CREATE TABLE dead_letters (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    actor       text NOT NULL,
    message_id  text,
    reason      text NOT NULL,
    detail      text NOT NULL,
    body        text NOT NULL,
    at          timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX job_attempts_by_outcome ON job_attempts (outcome, started_at);
