-- Core schema of the acceptance edge: tenants and keys, immutable documents, extraction jobs,
-- the transactional outbox, the job event log, per-attempt log, supplier master data, and the
-- sharded counters that make admission an O(1) read.

CREATE TABLE tenants (
    id                  uuid PRIMARY KEY,
    name                text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    weight              integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 1 AND 1000),
    max_in_flight       integer NOT NULL DEFAULT 8 CHECK (max_in_flight BETWEEN 1 AND 100000),
    max_pending_jobs    integer NOT NULL DEFAULT 20000 CHECK (max_pending_jobs >= 0),
    max_pending_bytes   bigint NOT NULL DEFAULT 1073741824 CHECK (max_pending_bytes >= 0),
    max_pending_tokens  bigint NOT NULL DEFAULT 200000000 CHECK (max_pending_tokens >= 0),
    daily_token_budget  bigint NOT NULL DEFAULT 500000000 CHECK (daily_token_budget >= 0),
    allowed_currencies  text[] NOT NULL DEFAULT '{TRY,EUR,USD,GBP}',
    created_at          timestamptz NOT NULL DEFAULT now()
);

-- Only a hash of each key is kept; the plaintext is shown once, when the key is made.
CREATE TABLE api_keys (
    id          uuid PRIMARY KEY,
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    prefix      text NOT NULL UNIQUE,
    secret_hash bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    revoked_at  timestamptz
);

CREATE TABLE documents (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    id          uuid NOT NULL,
    version     integer NOT NULL CHECK (version >= 1),
    sha256      text NOT NULL,
    size_bytes  integer NOT NULL CHECK (size_bytes >= 0),
    filename    text,
    text        text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, id, version)
);

CREATE FUNCTION fatura_documents_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'documents are immutable once written (tenant %, document %, version %)',
        OLD.tenant_id, OLD.id, OLD.version;
END $$;

CREATE TRIGGER documents_immutable BEFORE UPDATE ON documents
    FOR EACH ROW EXECUTE FUNCTION fatura_documents_immutable();

CREATE TABLE extraction_jobs (
    id                uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    idempotency_key   text NOT NULL,
    request_hash      text NOT NULL,
    document_id       uuid NOT NULL,
    document_version  integer NOT NULL,
    object_version    text NOT NULL,
    doc_bytes         integer NOT NULL,
    estimated_tokens  integer NOT NULL,
    schema_version    text NOT NULL,
    policy_version    text NOT NULL,
    model_policy      text NOT NULL,
    options           jsonb NOT NULL DEFAULT '{}',
    priority          text NOT NULL CHECK (priority IN ('interactive', 'batch')),
    state             text NOT NULL CHECK (state IN
                        ('READY', 'RUNNING', 'RETRY_SCHEDULED', 'SUCCEEDED',
                         'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'CANCELLED')),
    state_version     integer NOT NULL DEFAULT 1,
    attempt           integer NOT NULL DEFAULT 0,
    fence             bigint NOT NULL DEFAULT 0,
    lease_until       timestamptz,
    available_at      timestamptz NOT NULL DEFAULT now(),
    deadline_at       timestamptz NOT NULL,
    result_ref        text,
    error_class       text,
    error_message     text,
    review_reasons    jsonb,
    usage             jsonb,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    finished_at       timestamptz,
    UNIQUE (tenant_id, idempotency_key),
    FOREIGN KEY (tenant_id, document_id, document_version) REFERENCES documents (tenant_id, id, version)
);

CREATE INDEX extraction_jobs_by_tenant ON extraction_jobs (tenant_id, created_at DESC, id DESC);
CREATE INDEX extraction_jobs_by_tenant_state ON extraction_jobs (tenant_id, state, created_at DESC, id DESC);
CREATE INDEX extraction_jobs_eligible ON extraction_jobs (available_at)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');
CREATE INDEX extraction_jobs_leases ON extraction_jobs (lease_until) WHERE state = 'RUNNING';

CREATE TABLE outbox_events (
    event_id          uuid PRIMARY KEY,
    tenant_id         uuid NOT NULL,
    job_id            uuid REFERENCES extraction_jobs (id),
    event_type        text NOT NULL,
    payload           jsonb NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    claimed_until     timestamptz,
    claimed_by        text,
    publish_attempts  integer NOT NULL DEFAULT 0,
    published_at      timestamptz
);

CREATE INDEX outbox_events_unpublished ON outbox_events (created_at) WHERE published_at IS NULL;

CREATE TABLE job_events (
    seq            bigserial PRIMARY KEY,
    tenant_id      uuid NOT NULL,
    job_id         uuid NOT NULL REFERENCES extraction_jobs (id),
    state          text NOT NULL,
    state_version  integer NOT NULL,
    at             timestamptz NOT NULL DEFAULT now(),
    detail         jsonb,
    UNIQUE (job_id, state_version)
);

CREATE INDEX job_events_by_tenant ON job_events (tenant_id, seq);

CREATE TABLE job_attempts (
    id              bigserial PRIMARY KEY,
    job_id          uuid NOT NULL REFERENCES extraction_jobs (id),
    attempt         integer NOT NULL,
    fence           bigint NOT NULL,
    channel         text,
    model           text,
    started_at      timestamptz NOT NULL,
    ended_at        timestamptz,
    outcome         text NOT NULL,
    http_status     integer,
    error_class     text,
    retry_after_ms  integer,
    input_tokens    integer,
    output_tokens   integer,
    latency_ms      integer
);

CREATE INDEX job_attempts_by_job ON job_attempts (job_id, attempt);

CREATE TABLE suppliers (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    tax_id      text NOT NULL,
    name        text NOT NULL,
    iban        text,
    currency    text,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, tax_id)
);

-- Admission counters. Each backend adds to its own shard (pid modulo 16), so concurrent
-- acceptances rarely wait on one hot row; a check sums at most 16 rows per scope.
-- scope is a tenant id, or the nil uuid for the whole system.
CREATE TABLE admission_counters (
    scope           uuid NOT NULL,
    shard           smallint NOT NULL,
    pending_jobs    bigint NOT NULL DEFAULT 0,
    pending_bytes   bigint NOT NULL DEFAULT 0,
    pending_tokens  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (scope, shard)
);

-- Tokens charged to a tenant's day (UTC): the estimate while the job is pending, replaced by
-- the reported usage (usage->>'total_tokens', 0 when none) when the job becomes terminal.
CREATE TABLE daily_token_usage (
    tenant_id  uuid NOT NULL,
    day        date NOT NULL,
    shard      smallint NOT NULL,
    tokens     bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day, shard)
);

CREATE FUNCTION fatura_count_pending() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    my_shard  smallint := pg_backend_pid() % 16;
    sign   integer;
    job    extraction_jobs;
    used   bigint;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('READY', 'RUNNING', 'RETRY_SCHEDULED') THEN
            RETURN NULL;
        END IF;
        sign := 1;
        job := NEW;
        used := NEW.estimated_tokens;
    ELSIF OLD.state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')
          AND NEW.state NOT IN ('READY', 'RUNNING', 'RETRY_SCHEDULED') THEN
        sign := -1;
        job := OLD;
        used := coalesce((NEW.usage ->> 'total_tokens')::bigint, 0) - OLD.estimated_tokens;
    ELSE
        RETURN NULL;
    END IF;

    INSERT INTO admission_counters AS c (scope, shard, pending_jobs, pending_bytes, pending_tokens)
    VALUES (job.tenant_id, my_shard, sign, sign * job.doc_bytes, sign * job.estimated_tokens),
           ('00000000-0000-0000-0000-000000000000', my_shard, sign, sign * job.doc_bytes,
            sign * job.estimated_tokens)
    ON CONFLICT (scope, shard) DO UPDATE
        SET pending_jobs = c.pending_jobs + EXCLUDED.pending_jobs,
            pending_bytes = c.pending_bytes + EXCLUDED.pending_bytes,
            pending_tokens = c.pending_tokens + EXCLUDED.pending_tokens;

    IF used <> 0 THEN
        INSERT INTO daily_token_usage AS d (tenant_id, day, shard, tokens)
        VALUES (job.tenant_id, (job.created_at AT TIME ZONE 'UTC')::date, my_shard, used)
        ON CONFLICT (tenant_id, day, shard) DO UPDATE SET tokens = d.tokens + EXCLUDED.tokens;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER extraction_jobs_count_pending AFTER INSERT OR UPDATE OF state ON extraction_jobs
    FOR EACH ROW EXECUTE FUNCTION fatura_count_pending();
