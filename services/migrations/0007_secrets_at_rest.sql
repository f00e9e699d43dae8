-- Webhook secrets encrypted at rest, and a database role per service with only the grants it needs.
--
-- 1. Secrets. Each webhook_secrets row keeps, instead of the plaintext secret, the id of the master
--    key it is sealed under (FATURA_SECRETS_KEY; old ids stay readable through
--    FATURA_SECRETS_OLD_KEYS), a 96-bit nonce and the AES-256-GCM ciphertext with its tag; the
--    associated data is the endpoint id, the secret's key_id and the master key id
--    (services/common/keyring.py), so a ciphertext moved to another row does not open.
--
--    SQL cannot seal with our key, so `fatura migrate` runs a Python step of this migration first,
--    in the same transaction (services/common/migrate.py STEPS, services/common/secret_rows.py): it
--    locks webhook_secrets, seals every plaintext secret into the temporary table
--    pg_temp.fatura_sealed_webhook_secrets (needing FATURA_SECRETS_KEY only when there is a row to
--    seal), and this file then moves the sealed values into the new columns, clears and drops the
--    plaintext column. Run without that step, the temporary table is missing and the migration
--    fails before it changes anything; a row the step did not seal fails it too. So after migrate
--    no database has a plaintext column, whatever it held. Row versions written before this
--    migration (dead tuples until VACUUM, WAL, backups) still hold the old plaintext: rotate the
--    secrets where that matters.
--
-- 2. Roles. fatura_edge (HTTP edge), fatura_relay (outbox relay), fatura_inference (worker and
--    scheduler), fatura_delivery (worker and scheduler) are NOLOGIN roles; each process sets its
--    role at connect (services/common/db.py, FATURA_DB_ROLES) and then holds only the grants below.
--    Roles belong to the cluster, so they are created only when missing. Only fatura_delivery reads
--    webhook secrets; fatura_edge writes them and reads their names and dates, never a ciphertext.
--    A migration that adds a table grants it to the roles that use it.
--
-- 3. The counter and state-machine triggers run as their owner (SECURITY DEFINER, fixed
--    search_path), so a role that changes a job's state needs no grant on the counters or on
--    job_state_transitions.

ALTER TABLE webhook_secrets
    ADD COLUMN master_key_id  text,
    ADD COLUMN nonce          bytea,
    ADD COLUMN ciphertext     bytea,
    ALTER COLUMN secret DROP NOT NULL;

UPDATE webhook_secrets s
SET master_key_id = t.master_key_id, nonce = t.nonce, ciphertext = t.ciphertext, secret = NULL
FROM pg_temp.fatura_sealed_webhook_secrets t
WHERE t.endpoint_id = s.endpoint_id AND t.key_id = s.key_id;

DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM webhook_secrets WHERE ciphertext IS NULL OR secret IS NOT NULL) THEN
        RAISE EXCEPTION 'a webhook secret was not sealed by the migration step; nothing was changed';
    END IF;
END $$;

ALTER TABLE webhook_secrets
    DROP COLUMN secret,
    ALTER COLUMN master_key_id SET NOT NULL,
    ALTER COLUMN nonce SET NOT NULL,
    ALTER COLUMN ciphertext SET NOT NULL,
    ADD CONSTRAINT webhook_secrets_master_key_id CHECK (master_key_id ~ '^[A-Za-z0-9_.-]{1,32}$'),
    ADD CONSTRAINT webhook_secrets_nonce CHECK (octet_length(nonce) = 12),
    ADD CONSTRAINT webhook_secrets_ciphertext CHECK (octet_length(ciphertext) BETWEEN 17 AND 512);

-- `fatura secrets rewrap` finds the rows sealed under an old master key.
CREATE INDEX webhook_secrets_by_master_key ON webhook_secrets (master_key_id);

-- Roles.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['fatura_edge', 'fatura_relay', 'fatura_inference', 'fatura_delivery'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            BEGIN
                EXECUTE format('CREATE ROLE %I NOLOGIN', r);
            EXCEPTION WHEN duplicate_object OR unique_violation THEN
                NULL;  -- the migration of another database on this cluster made it meanwhile
            END;
        END IF;
    END LOOP;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO fatura_edge, fatura_relay, fatura_inference, fatura_delivery',
                   current_schema());
    EXECUTE format('ALTER FUNCTION fatura_count_pending() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION fatura_job_transition_allowed() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;

-- The HTTP edge: authentication, documents, acceptance (the admission counters are read, the
-- trigger writes them), job reads and cancel, webhook endpoints and deliveries of a tenant, the
-- operator's dead-letter routes.
GRANT SELECT ON tenants, api_keys, admission_counters, daily_token_usage, delivery_attempts TO fatura_edge;
GRANT SELECT, INSERT ON documents, job_events TO fatura_edge;
GRANT SELECT, INSERT, UPDATE ON extraction_jobs, webhook_endpoints TO fatura_edge;
GRANT INSERT ON outbox_events TO fatura_edge;
GRANT SELECT, UPDATE ON deliveries, dead_letters TO fatura_edge;
GRANT SELECT (endpoint_id, key_id, created_at, not_after),
      INSERT (endpoint_id, key_id, master_key_id, nonce, ciphertext),
      UPDATE (not_after)
    ON webhook_secrets TO fatura_edge;
GRANT USAGE ON SEQUENCE job_events_seq_seq TO fatura_edge;

-- The outbox relay.
GRANT SELECT, UPDATE ON outbox_events TO fatura_relay;

-- Inference: the fair claim, the job's document, tenant and suppliers, fenced completions, the
-- attempt log, the execution inbox, the reconciler and the dead letters of its queues.
GRANT SELECT ON tenants, documents, suppliers TO fatura_inference;
GRANT SELECT, UPDATE ON extraction_jobs TO fatura_inference;
GRANT INSERT ON job_attempts, job_events, inbox_quarantine TO fatura_inference;
GRANT SELECT, INSERT ON outbox_events, execution_inbox TO fatura_inference;
GRANT SELECT, INSERT, UPDATE, DELETE ON dead_letters TO fatura_inference;
GRANT USAGE ON SEQUENCE job_attempts_id_seq, job_events_seq_seq, inbox_quarantine_id_seq, dead_letters_id_seq
    TO fatura_inference;

-- Delivery: the finished job a webhook reports, endpoints and their secrets, deliveries and their
-- attempts, the delivery inbox, the reconciler and the dead letters of its queues.
GRANT SELECT ON extraction_jobs, job_events, outbox_events, webhook_secrets TO fatura_delivery;
GRANT SELECT, UPDATE ON webhook_endpoints TO fatura_delivery;
GRANT SELECT, INSERT, UPDATE ON deliveries TO fatura_delivery;
GRANT SELECT, INSERT ON delivery_attempts, delivery_inbox TO fatura_delivery;
GRANT INSERT ON inbox_quarantine TO fatura_delivery;
GRANT SELECT, INSERT, UPDATE, DELETE ON dead_letters TO fatura_delivery;
GRANT USAGE ON SEQUENCE delivery_attempts_id_seq, inbox_quarantine_id_seq, dead_letters_id_seq
    TO fatura_delivery;
