-- The admission counters and the day's token usage (fatura_count_pending, 0001) were updated by a
-- trigger at the statement that changed the job, and the shard rows it updated stayed locked until
-- the transaction ended. A slot's completion shares its transaction with the slot's next claim,
-- which asks the limiter (a gRPC round trip) between locking the next job and starting it, so the
-- shard rows of the completion stayed locked across that call: in `fatura bench pipeline` the
-- acceptances and completions of other backends on the same shard (pid modulo 16; the run has
-- about 26 backends) waited for it, and a sample of pg_stat_activity found the waiters blocked by
-- transactions "idle in transaction" after their head-job read. The same function now runs when
-- the transaction commits (a deferred constraint trigger): the rows are locked only for the
-- commit itself. Each change is still counted once, from the old and new row of its own UPDATE or
-- INSERT; a transaction that rolls back counts nothing, as before. Nothing reads the counters in
-- the transaction that changed a job: the careful path reads them before it writes, under the
-- tenant's admission lock, which is held until the commit has counted.
DROP TRIGGER extraction_jobs_count_pending ON extraction_jobs;

CREATE CONSTRAINT TRIGGER extraction_jobs_count_pending
    AFTER INSERT OR UPDATE OF state ON extraction_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION fatura_count_pending();
