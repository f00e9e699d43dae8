-- The optional Kafka ingress and job-event export (services/acceptance/kafka).

-- One row per Kafka record the ingress has finished with, keyed by where it sits in the log. It is
-- written in the transaction that accepts the record's job (or, for a replay of an idempotency key
-- or a dead-lettered record, on its own), before the record's offset is committed: a record
-- delivered again after a crash or a rebalance finds its row and is not taken twice.
CREATE TABLE kafka_ingress_inbox (
    topic            text NOT NULL,
    partition        integer NOT NULL CHECK (partition >= 0),
    "offset"         bigint NOT NULL CHECK ("offset" >= 0),
    outcome          text NOT NULL CHECK (outcome IN ('accepted', 'replayed', 'dead_lettered')),
    tenant_id        uuid,
    idempotency_key  text,
    job_id           uuid,
    reason           text,
    received_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, partition, "offset"),
    CHECK ((outcome = 'dead_lettered') = (job_id IS NULL))
);

-- How far each export has sent job_events to its Kafka topic: every seq <= through was produced
-- and acknowledged. The exporter advances it after the broker acknowledged the events.
CREATE TABLE kafka_export_cursors (
    name        text PRIMARY KEY,
    through     bigint NOT NULL DEFAULT 0 CHECK (through >= 0),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- The ingress accepts jobs as the edge does, so it runs as the edge's role; the exporter reads job
-- events as the edge's event feed does.
GRANT SELECT, INSERT ON kafka_ingress_inbox TO fatura_edge;
GRANT SELECT, INSERT, UPDATE ON kafka_export_cursors TO fatura_edge;
