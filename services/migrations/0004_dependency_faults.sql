-- Surviving dependency faults (DESIGN §5.12): dead letters an operator can read and redrive, the
-- index the reconciler reads to find published events no consumer took in, API key scopes for the
-- operator endpoints, and a job's token usage summed over every attempt (each call may be billed).

-- A dead letter keeps the whole broker message, so a redrive republishes exactly what was refused.
-- `source` says who dead-lettered it: a consumer that refused it (malformed, unknown type or
-- version, digest conflict, an unexpected error that kept recurring) or the broker (the delivery
-- limit was reached, the body was not a message at all), drained from `<queue>.XQ`.
ALTER TABLE dead_letters
    ADD COLUMN source         text NOT NULL DEFAULT 'consumer' CHECK (source IN ('consumer', 'broker')),
    ADD COLUMN message        jsonb,
    ADD COLUMN redriven_at    timestamptz,
    ADD COLUMN redrive_count  integer NOT NULL DEFAULT 0,
    -- An operator asked for a redrive; the scheduler of the queue's service publishes it.
    ADD COLUMN redrive_requested_at timestamptz;

CREATE INDEX dead_letters_open ON dead_letters (at) WHERE redriven_at IS NULL;
CREATE INDEX dead_letters_redrive_requested ON dead_letters (redrive_requested_at)
    WHERE redrive_requested_at IS NOT NULL AND redriven_at IS NULL;
CREATE INDEX dead_letters_at ON dead_letters (at);
-- The reconciler does not re-drive an event whose message is a dead letter an operator must look at.
CREATE INDEX dead_letters_message ON dead_letters (message_id) WHERE redriven_at IS NULL;

-- The reconciler looks for events published a while ago that a consumer's inbox never recorded.
CREATE INDEX outbox_events_published ON outbox_events (published_at, event_type)
    WHERE published_at IS NOT NULL;

-- Key scopes: `tenant` (a tenant's own jobs, endpoints and deliveries), `reviewer` (one tenant's
-- reviews) and `operator` (cross-tenant operations; belongs to no tenant).
ALTER TABLE api_keys
    ADD COLUMN scope  text NOT NULL DEFAULT 'tenant' CHECK (scope IN ('tenant', 'reviewer', 'operator')),
    ADD COLUMN label  text;
ALTER TABLE api_keys ALTER COLUMN tenant_id DROP NOT NULL;
ALTER TABLE api_keys ADD CONSTRAINT api_keys_scope_tenant
    CHECK ((scope = 'operator') = (tenant_id IS NULL));

-- Token usage of a job is the sum over its attempts: each numeric member of `extra` is added to
-- the same member of `total` (a member missing on one side counts as 0).
CREATE FUNCTION fatura_usage_add(total jsonb, extra jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN extra IS NULL THEN total
        WHEN total IS NULL THEN extra
        ELSE (SELECT jsonb_object_agg(k, coalesce((total ->> k)::numeric, 0) + coalesce((extra ->> k)::numeric, 0))
              FROM (SELECT jsonb_object_keys(total) UNION SELECT jsonb_object_keys(extra)) AS keys (k))
    END
$$;
