-- The job state machine of DESIGN §3 (services/common/states.py), enforced by the database: a
-- change of extraction_jobs.state that is not an allowed transition is refused, whoever writes it.
-- Terminal states have no way out. A test checks this table against states.TRANSITIONS.

CREATE TABLE job_state_transitions (
    from_state  text NOT NULL,
    to_state    text NOT NULL,
    PRIMARY KEY (from_state, to_state)
);

INSERT INTO job_state_transitions (from_state, to_state) VALUES
    ('READY', 'RUNNING'), ('READY', 'CANCELLED'), ('READY', 'FAILED_TERMINAL'),
    ('RUNNING', 'SUCCEEDED'), ('RUNNING', 'REVIEW_REQUIRED'), ('RUNNING', 'RETRY_SCHEDULED'),
    ('RUNNING', 'FAILED_TERMINAL'), ('RUNNING', 'CANCELLED'),
    ('RETRY_SCHEDULED', 'RUNNING'), ('RETRY_SCHEDULED', 'CANCELLED'), ('RETRY_SCHEDULED', 'FAILED_TERMINAL');

CREATE FUNCTION fatura_job_transition_allowed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IS DISTINCT FROM OLD.state AND NOT EXISTS (
        SELECT 1 FROM job_state_transitions WHERE from_state = OLD.state AND to_state = NEW.state
    ) THEN
        RAISE EXCEPTION 'illegal job state transition % -> % (job %)', OLD.state, NEW.state, OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER extraction_jobs_transition_allowed BEFORE UPDATE OF state ON extraction_jobs
    FOR EACH ROW EXECUTE FUNCTION fatura_job_transition_allowed();
