-- The receiver's durable inbox in SQLite. One row per webhook-id ever accepted; the partner's own
-- tables (written by its apply function) live in the same database and commit in the same
-- transaction, so "accepted" and "applied" can never disagree.

-- name: create_schema
CREATE TABLE IF NOT EXISTS fatura_inbox (
    webhook_id     TEXT PRIMARY KEY,
    payload_digest TEXT NOT NULL,
    event_type     TEXT NOT NULL,
    event_id       TEXT,
    received_at    REAL NOT NULL,
    duplicates     INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS fatura_inbox_counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);

-- name: insert_inbox
INSERT INTO fatura_inbox (webhook_id, payload_digest, event_type, event_id, received_at)
VALUES (:webhook_id, :payload_digest, :event_type, :event_id, :received_at)
ON CONFLICT (webhook_id) DO NOTHING;

-- name: inbox_digest
SELECT payload_digest FROM fatura_inbox WHERE webhook_id = :webhook_id;

-- name: count_duplicate
UPDATE fatura_inbox SET duplicates = duplicates + 1 WHERE webhook_id = :webhook_id;

-- name: bump_counter
INSERT INTO fatura_inbox_counters (name, value) VALUES (:name, 1)
ON CONFLICT (name) DO UPDATE SET value = value + 1;

-- name: counters
SELECT name, value FROM fatura_inbox_counters;
