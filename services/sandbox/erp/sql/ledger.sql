-- The reference ERP's own tables, in the same SQLite database as the fatura_sdk inbox, written in
-- the inbox transaction by ledger.apply.

-- name: create_schema
CREATE TABLE IF NOT EXISTS erp_jobs (
    job_id             TEXT PRIMARY KEY,
    tenant_id          TEXT,
    state              TEXT NOT NULL,
    state_version      INTEGER NOT NULL,
    event_type         TEXT NOT NULL,
    result_digest      TEXT,
    applied_webhook_id TEXT NOT NULL,
    effects            INTEGER NOT NULL,
    applied_at         REAL NOT NULL
);
-- One row per webhook-id taken into the inbox: which job it was for and what it did there.
CREATE TABLE IF NOT EXISTS erp_receipts (
    webhook_id    TEXT PRIMARY KEY,
    job_id        TEXT,
    event_type    TEXT NOT NULL,
    state_version INTEGER,
    outcome       TEXT NOT NULL CHECK (outcome IN ('applied', 'not_newer', 'ignored')),
    received_at   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS erp_receipts_by_job ON erp_receipts (job_id);
CREATE TABLE IF NOT EXISTS erp_secrets (
    secret   TEXT PRIMARY KEY,
    added_at REAL NOT NULL
);

-- name: apply_newer
-- Insert the job, or update it only when this state_version is newer than the one applied.
INSERT INTO erp_jobs (job_id, tenant_id, state, state_version, event_type, result_digest,
                      applied_webhook_id, effects, applied_at)
VALUES (:job_id, :tenant_id, :state, :state_version, :event_type, :result_digest,
        :webhook_id, 1, :now)
ON CONFLICT (job_id) DO UPDATE SET
    tenant_id = excluded.tenant_id,
    state = excluded.state,
    state_version = excluded.state_version,
    event_type = excluded.event_type,
    result_digest = excluded.result_digest,
    applied_webhook_id = excluded.applied_webhook_id,
    effects = erp_jobs.effects + 1,
    applied_at = excluded.applied_at
WHERE excluded.state_version > erp_jobs.state_version;

-- name: insert_receipt
INSERT INTO erp_receipts (webhook_id, job_id, event_type, state_version, outcome, received_at)
VALUES (:webhook_id, :job_id, :event_type, :state_version, :outcome, :now);

-- name: ledger_jobs
SELECT job_id, tenant_id, state, state_version, event_type, result_digest, applied_webhook_id,
       effects, applied_at
FROM erp_jobs
WHERE :job_id IS NULL OR job_id = :job_id
ORDER BY applied_at, job_id;

-- name: ledger_receipts
SELECT r.job_id, r.webhook_id, r.state_version, r.outcome, i.duplicates
FROM erp_receipts r
JOIN fatura_inbox i ON i.webhook_id = r.webhook_id
WHERE r.job_id IS NOT NULL AND (:job_id IS NULL OR r.job_id = :job_id)
ORDER BY r.received_at, r.webhook_id;

-- name: posted_secrets
SELECT secret FROM erp_secrets ORDER BY added_at, secret;

-- name: clear_secrets
DELETE FROM erp_secrets;

-- name: add_secret
INSERT INTO erp_secrets (secret, added_at) VALUES (:secret, :now) ON CONFLICT (secret) DO NOTHING;
