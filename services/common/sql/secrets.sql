-- Webhook secrets at rest (services/common/secret_rows.py): the step of migration 0007 and rewrap.

-- name: lock_for_sealing
-- Nothing writes a secret while the migration seals them and changes the table.
LOCK TABLE webhook_secrets IN ACCESS EXCLUSIVE MODE

-- name: create_sealed
CREATE TEMPORARY TABLE fatura_sealed_webhook_secrets (
    endpoint_id    uuid NOT NULL,
    key_id         text NOT NULL,
    master_key_id  text NOT NULL,
    nonce          bytea NOT NULL,
    ciphertext     bytea NOT NULL,
    PRIMARY KEY (endpoint_id, key_id)
) ON COMMIT DROP

-- name: plaintext_secrets
SELECT endpoint_id, key_id, secret FROM webhook_secrets WHERE secret IS NOT NULL

-- name: insert_sealed
INSERT INTO pg_temp.fatura_sealed_webhook_secrets (endpoint_id, key_id, master_key_id, nonce, ciphertext)
VALUES (%(endpoint_id)s, %(key_id)s, %(master_key_id)s, %(nonce)s, %(ciphertext)s)

-- name: count_by_master_key
SELECT master_key_id, count(*) AS secrets FROM webhook_secrets GROUP BY master_key_id ORDER BY master_key_id

-- name: stale_batch
-- Rows sealed under another master key than the current one, a bounded batch at a time in key
-- order (a row that does not open is left behind, not read again).
SELECT endpoint_id, key_id, master_key_id, nonce, ciphertext FROM webhook_secrets
WHERE master_key_id <> %(current)s AND (endpoint_id, key_id) > (%(after_endpoint)s, %(after_key)s)
ORDER BY endpoint_id, key_id
LIMIT %(limit)s
FOR UPDATE

-- name: reseal
UPDATE webhook_secrets
SET master_key_id = %(master_key_id)s, nonce = %(nonce)s, ciphertext = %(ciphertext)s
WHERE endpoint_id = %(endpoint_id)s AND key_id = %(key_id)s AND master_key_id = %(old_master_key_id)s
