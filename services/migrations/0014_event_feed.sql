-- The job event feed (services/acceptance/feed.py): clients stream job_events over SSE and gRPC,
-- resuming from the last sequence they saw, within a retention the relay's housekeeping enforces.

-- A job's stream replays that job's events from a cursor; (tenant_id, seq) serves the tenant's.
CREATE INDEX job_events_by_job ON job_events (job_id, seq);

-- How far job_events have been pruned: every event with seq <= pruned_through is gone. A client
-- resuming from an older cursor has missed events that no longer exist, so it gets a snapshot of
-- its jobs first. One row; the relay advances it in the transaction that deletes the events.
CREATE TABLE job_event_horizon (
    singleton       boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    pruned_through  bigint NOT NULL DEFAULT 0,
    pruned_at       timestamptz
);
INSERT INTO job_event_horizon DEFAULT VALUES;

-- The edge (and the JobService, which runs as the edge's role) reads the horizon with the events;
-- the relay prunes.
GRANT SELECT ON job_event_horizon TO fatura_edge;
GRANT SELECT, UPDATE ON job_event_horizon TO fatura_relay;
GRANT SELECT, DELETE ON job_events TO fatura_relay;
