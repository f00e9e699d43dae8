-- Extraction batches (POST /v1/extraction-batches): many documents under one Idempotency-Key. Each
-- item is an ordinary extraction job that names its batch and its index in it; the batch keeps
-- counters of its items by state, sharded like the admission counters (0001) and kept by a
-- trigger, so reading a batch of 10,000 costs the same as reading a batch of one.
--
-- A batch is `accepting` while its chunks are written (one transaction each), `running` once every
-- item is written, and `completed` (every item SUCCEEDED) or `completed_with_errors` (at least one
-- FAILED_TERMINAL, REJECTED or CANCELLED) once every item is final. An item waiting for a reviewer
-- (REVIEW_REQUIRED) is not final: its batch is still running. The batch.completed.v1 outbox event is
-- written by fatura_close_batch, in the transaction of the item change that finishes the batch, or
-- by the relay's sweep when two last items finished at the same instant and neither saw the other.

CREATE TABLE extraction_batches (
    id               uuid PRIMARY KEY,
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    idempotency_key  text NOT NULL,
    -- Covers every item's key and request hash, in order (services/acceptance/batches.py).
    request_hash     text NOT NULL,
    total            integer NOT NULL CHECK (total >= 1),
    -- Items written so far: every chunk committed adds its items.
    accepted         integer NOT NULL DEFAULT 0 CHECK (accepted BETWEEN 0 AND total),
    priority         text NOT NULL CHECK (priority IN ('interactive', 'batch')),
    state            text NOT NULL DEFAULT 'accepting'
                       CHECK (state IN ('accepting', 'running', 'completed', 'completed_with_errors')),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    UNIQUE (tenant_id, idempotency_key)
);

CREATE INDEX extraction_batches_running ON extraction_batches (created_at) WHERE state = 'running';

-- Items by final or review state, per batch; each backend adds to its own shard (pid modulo 16).
-- An item not counted here is pending (READY, RUNNING, RETRY_SCHEDULED) or not yet written.
CREATE TABLE batch_counters (
    batch_id         uuid NOT NULL REFERENCES extraction_batches (id),
    shard            smallint NOT NULL,
    succeeded        integer NOT NULL DEFAULT 0,
    review_required  integer NOT NULL DEFAULT 0,
    failed           integer NOT NULL DEFAULT 0,
    rejected         integer NOT NULL DEFAULT 0,
    cancelled        integer NOT NULL DEFAULT 0,
    PRIMARY KEY (batch_id, shard)
);

ALTER TABLE extraction_jobs
    ADD COLUMN batch_id     uuid REFERENCES extraction_batches (id),
    ADD COLUMN batch_index  integer,
    ADD CONSTRAINT extraction_jobs_batch_item CHECK ((batch_id IS NULL) = (batch_index IS NULL));

CREATE UNIQUE INDEX extraction_jobs_batch_items ON extraction_jobs (batch_id, batch_index)
    WHERE batch_id IS NOT NULL;
CREATE INDEX extraction_jobs_batch_items_by_state ON extraction_jobs (batch_id, state, batch_index)
    WHERE batch_id IS NOT NULL;

-- Closes a running batch whose items are all final: its state, and its batch.completed.v1 outbox
-- event (ids and counts' outcome only, like every event). Exactly once: the update is conditional
-- on `running`, and a second closer waits for the first one's row lock and then finds nothing.
CREATE FUNCTION fatura_close_batch(closing uuid) RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    b        extraction_batches;
    c        record;
    outcome  text;
    event    uuid := gen_random_uuid();
BEGIN
    SELECT * INTO b FROM extraction_batches WHERE id = closing;
    IF NOT FOUND OR b.state <> 'running' THEN
        RETURN false;
    END IF;
    SELECT coalesce(sum(succeeded), 0) AS succeeded,
           coalesce(sum(succeeded + failed + rejected + cancelled), 0) AS final
    INTO c FROM batch_counters WHERE batch_id = closing;
    IF c.final < b.total THEN
        RETURN false;
    END IF;
    outcome := CASE WHEN c.succeeded >= b.total THEN 'completed' ELSE 'completed_with_errors' END;
    UPDATE extraction_batches SET state = outcome, completed_at = now(), updated_at = now()
    WHERE id = closing AND state = 'running';
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    INSERT INTO outbox_events (event_id, tenant_id, job_id, event_type, payload)
    VALUES (event, b.tenant_id, NULL, 'batch.completed.v1',
            jsonb_build_object('event_id', event, 'event_type', 'batch.completed.v1',
                               'tenant_id', b.tenant_id, 'batch_id', closing,
                               'state', outcome, 'state_version', 1));
    RETURN true;
END $$;

CREATE FUNCTION fatura_count_batch_items() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO batch_counters AS c (batch_id, shard, succeeded, review_required, failed, rejected,
                                     cancelled)
    VALUES (NEW.batch_id, pg_backend_pid() % 16,
            (NEW.state = 'SUCCEEDED')::int - (OLD.state = 'SUCCEEDED')::int,
            (NEW.state = 'REVIEW_REQUIRED')::int - (OLD.state = 'REVIEW_REQUIRED')::int,
            (NEW.state = 'FAILED_TERMINAL')::int - (OLD.state = 'FAILED_TERMINAL')::int,
            (NEW.state = 'REJECTED')::int - (OLD.state = 'REJECTED')::int,
            (NEW.state = 'CANCELLED')::int - (OLD.state = 'CANCELLED')::int)
    ON CONFLICT (batch_id, shard) DO UPDATE
        SET succeeded = c.succeeded + EXCLUDED.succeeded,
            review_required = c.review_required + EXCLUDED.review_required,
            failed = c.failed + EXCLUDED.failed,
            rejected = c.rejected + EXCLUDED.rejected,
            cancelled = c.cancelled + EXCLUDED.cancelled;
    IF NEW.state IN ('SUCCEEDED', 'FAILED_TERMINAL', 'REJECTED', 'CANCELLED') THEN
        PERFORM fatura_close_batch(NEW.batch_id);
    END IF;
    RETURN NULL;
END $$;

-- Only items of a batch, and only changes into or out of a counted state, reach the function:
-- a job outside any batch pays nothing.
CREATE TRIGGER extraction_jobs_count_batch_items AFTER UPDATE OF state ON extraction_jobs
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
          AND (NEW.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'REJECTED', 'CANCELLED')
               OR OLD.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'REJECTED',
                                'CANCELLED')))
    EXECUTE FUNCTION fatura_count_batch_items();

-- Like the counters of 0007, the trigger's work needs no grant from the role whose change fires it.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION fatura_close_batch(uuid) SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
    EXECUTE format('ALTER FUNCTION fatura_count_batch_items() SECURITY DEFINER SET search_path = %I, pg_temp',
                   current_schema());
END $$;
REVOKE EXECUTE ON FUNCTION fatura_close_batch(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION fatura_close_batch(uuid) TO fatura_relay;

-- Grants under the service roles of 0007. The edge accepts batches and reads them with their
-- items; the relay's sweep closes batches whose last items finished together; delivery builds
-- the batch.completed.v1 webhook from the batch and its counts.
GRANT SELECT, INSERT, UPDATE ON extraction_batches TO fatura_edge;
GRANT SELECT ON batch_counters TO fatura_edge;
GRANT SELECT ON extraction_batches, batch_counters TO fatura_relay;
GRANT SELECT ON extraction_batches, batch_counters TO fatura_delivery;
