-- Delivery service: webhook endpoints and their secrets, the delivery inbox (dedup of completion
-- events by event id), one delivery per event x endpoint, and the log of every attempt.

CREATE TABLE webhook_endpoints (
    id                      uuid PRIMARY KEY,
    tenant_id               uuid NOT NULL REFERENCES tenants (id),
    url                     text NOT NULL CHECK (length(url) BETWEEN 1 AND 2048),
    event_types             text[] NOT NULL CHECK (cardinality(event_types) >= 1),
    state                   text NOT NULL DEFAULT 'enabled' CHECK (state IN ('enabled', 'disabled')),
    disabled_reason         text,
    disabled_at             timestamptz,
    verified_at             timestamptz,
    consecutive_auth_failures integer NOT NULL DEFAULT 0,
    -- Circuit breaker: consecutive retryable failures; while breaker_open_until is in the future
    -- no delivery to this endpoint is attempted (they wait, they are not failed).
    consecutive_failures    integer NOT NULL DEFAULT 0,
    breaker_open_until      timestamptz,
    max_concurrency         integer NOT NULL DEFAULT 4 CHECK (max_concurrency BETWEEN 1 AND 1000),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX webhook_endpoints_by_tenant ON webhook_endpoints (tenant_id, created_at);

-- Several rows per endpoint while a secret rotates: every secret whose not_after is NULL or in
-- the future signs each delivery. Kept in plaintext because signing needs the key itself.
CREATE TABLE webhook_secrets (
    endpoint_id  uuid NOT NULL REFERENCES webhook_endpoints (id),
    key_id       text NOT NULL,
    secret       text NOT NULL CHECK (secret LIKE 'whsec\_%'),
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    not_after    timestamptz,
    PRIMARY KEY (endpoint_id, key_id)
);

CREATE TABLE delivery_inbox (
    event_id        uuid PRIMARY KEY,
    job_id          uuid NOT NULL,
    payload_digest  text NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- An event id seen again with a different payload: kept here for an operator, never applied.
CREATE TABLE delivery_quarantine (
    id              bigserial PRIMARY KEY,
    event_id        uuid NOT NULL,
    payload         jsonb NOT NULL,
    payload_digest  text NOT NULL,
    reason          text NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);

-- The body is frozen when the delivery is created (ingest), so every retry and every resend
-- sends the same bytes; only webhook-timestamp and the signatures change per attempt.
CREATE TABLE deliveries (
    delivery_id      uuid PRIMARY KEY,
    event_id         uuid NOT NULL,
    event_type       text NOT NULL,
    endpoint_id      uuid NOT NULL REFERENCES webhook_endpoints (id),
    tenant_id        uuid NOT NULL,
    job_id           uuid,
    state            text NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'delivering', 'delivered', 'failed', 'dead')),
    reason           text,
    body             bytea NOT NULL,
    attempts         integer NOT NULL DEFAULT 0,
    -- attempts when the delivery was last resent: the retry schedule restarts from there.
    attempts_base    integer NOT NULL DEFAULT 0,
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    -- The sender's claim: fence grows on every claim, and an outcome is recorded only under the
    -- fence that claimed it, so a sender whose lease ran out cannot overwrite a newer outcome.
    fence            bigint NOT NULL DEFAULT 0,
    lease_until      timestamptz,
    woken_at         timestamptz,
    last_status      integer,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    UNIQUE (event_id, endpoint_id)
);

CREATE INDEX deliveries_due ON deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX deliveries_leases ON deliveries (lease_until) WHERE state = 'delivering';
CREATE INDEX deliveries_by_job ON deliveries (tenant_id, job_id, created_at);
CREATE INDEX deliveries_by_endpoint ON deliveries (endpoint_id, state, updated_at);

CREATE TABLE delivery_attempts (
    id              bigserial PRIMARY KEY,
    delivery_id     uuid NOT NULL REFERENCES deliveries (delivery_id),
    attempt         integer NOT NULL,
    fence           bigint NOT NULL,
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz NOT NULL DEFAULT now(),
    outcome         text NOT NULL,
    http_status     integer,
    error_class     text,
    response_body   text CHECK (octet_length(response_body) <= 65536),
    retry_after_ms  bigint,
    latency_ms      integer
);

CREATE INDEX delivery_attempts_by_delivery ON delivery_attempts (delivery_id, id);
