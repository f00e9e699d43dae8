-- A batch item's counts (fatura_count_batch_items, 0013) at commit, as 0027 did for the admission
-- counters, and for the same reason: the completion that finishes an item shares its transaction
-- with the slot's next claim and its limiter call, and the item's batch_counters shard row
-- (pid modulo 16) stayed locked across that call, so the completions of the batch's other items
-- on the same shard waited for it. The same function now runs when the transaction commits, from
-- the change's own old and new row; the WHEN condition is still read at the UPDATE. When it closes
-- the batch, the batch's state and its batch.completed.v1 event are written in that same commit.
-- Two last items committing at the same instant may still each miss the other; the relay's sweep
-- closes such a batch, as before.
DROP TRIGGER extraction_jobs_count_batch_items ON extraction_jobs;

CREATE CONSTRAINT TRIGGER extraction_jobs_count_batch_items
    AFTER UPDATE OF state ON extraction_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (NEW.batch_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state
          AND (NEW.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'REJECTED', 'CANCELLED')
               OR OLD.state IN ('SUCCEEDED', 'REVIEW_REQUIRED', 'FAILED_TERMINAL', 'REJECTED',
                                'CANCELLED')))
    EXECUTE FUNCTION fatura_count_batch_items();
