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
-- The invoices on the books, one per (tenant, supplier, number): a second job bringing the same
-- supplier's invoice number is a duplicate, which the ERP rejects.
CREATE TABLE IF NOT EXISTS erp_invoices (
    tenant_id       TEXT NOT NULL,
    supplier_tax_id TEXT NOT NULL,
    invoice_number  TEXT NOT NULL,
    job_id          TEXT NOT NULL,
    posted_at       REAL NOT NULL,
    PRIMARY KEY (tenant_id, supplier_tax_id, invoice_number)
);
-- The business acknowledgement owed for each delivery of a result (its webhook-id), written in the
-- inbox transaction that applied it and sent to Fatura after that commit: an outbox, so a crash
-- between the commit and the send only delays it.
CREATE TABLE IF NOT EXISTS erp_acks (
    webhook_id      TEXT PRIMARY KEY,
    job_id          TEXT NOT NULL,
    outcome         TEXT NOT NULL CHECK (outcome IN ('posted', 'rejected')),
    reason          TEXT,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'failed')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error      TEXT,
    created_at      REAL NOT NULL,
    sent_at         REAL
);
CREATE INDEX IF NOT EXISTS erp_acks_due ON erp_acks (next_attempt_at) WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS erp_acks_by_job ON erp_acks (job_id);

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

-- name: invoice_owner
SELECT job_id FROM erp_invoices
WHERE tenant_id = :tenant_id AND supplier_tax_id = :supplier_tax_id AND invoice_number = :invoice_number;

-- name: post_invoice
INSERT INTO erp_invoices (tenant_id, supplier_tax_id, invoice_number, job_id, posted_at)
VALUES (:tenant_id, :supplier_tax_id, :invoice_number, :job_id, :now)
ON CONFLICT DO NOTHING;

-- name: owe_ack
INSERT INTO erp_acks (webhook_id, job_id, outcome, reason, next_attempt_at, created_at)
VALUES (:webhook_id, :job_id, :outcome, :reason, :now, :now)
ON CONFLICT (webhook_id) DO NOTHING;

-- name: due_acks
SELECT webhook_id, job_id, outcome, reason, attempts FROM erp_acks
WHERE state = 'pending' AND next_attempt_at <= :now
ORDER BY next_attempt_at
LIMIT :limit;

-- name: next_ack_at
SELECT min(next_attempt_at) AS at FROM erp_acks WHERE state = 'pending';

-- name: ack_sent
UPDATE erp_acks SET state = 'sent', attempts = attempts + 1, sent_at = :now, last_error = NULL
WHERE webhook_id = :webhook_id;

-- name: ack_retry
UPDATE erp_acks SET attempts = attempts + 1, next_attempt_at = :next_attempt_at, last_error = :error
WHERE webhook_id = :webhook_id;

-- name: ack_failed
UPDATE erp_acks SET state = 'failed', attempts = attempts + 1, last_error = :error
WHERE webhook_id = :webhook_id;

-- name: rearm_ack
-- Fatura sent the delivery again (a resend, or a retry after a lost 2xx): an acknowledgement that
-- gave up is owed again.
UPDATE erp_acks SET state = 'pending', attempts = 0, next_attempt_at = :now
WHERE webhook_id = :webhook_id AND state = 'failed';

-- name: ledger_acks
SELECT job_id, webhook_id, outcome, reason, state, attempts, last_error, created_at, sent_at
FROM erp_acks
WHERE :job_id IS NULL OR job_id = :job_id
ORDER BY created_at, webhook_id;
