-- A claim's reads scoped to one tenant (head_job, and the heads in tenant_loads: the tenant's next
-- due job of a priority) were planned on extraction_jobs_backlog (priority, available_at) or on
-- extraction_jobs_eligible (available_at), neither of which knows the tenant: the scan walked the
-- other tenants' eligible jobs in time order, fetching each row for its tenant_id, until it met
-- the tenant's first. Behind another tenant's 5,000-job backlog that was 784,516 heap fetches in
-- one `fatura bench fairness` (56 per scan; a whole backlog for each head of the tenant behind).
-- Led by (priority, tenant_id), the backlog index answers those reads exactly, as
-- extraction_jobs_eligible_by_tenant does, so whichever of the two the planner picks reads only
-- the tenant's own entries. The scheduler's runnable_backlog still counts each priority and finds
-- its oldest in one index-only scan of this index (the count reads every entry of the priority
-- either way), and the wake-up top-up's capped due count reads it or the tenant index: nothing is
-- left that needs extraction_jobs_eligible.
DROP INDEX extraction_jobs_backlog;

CREATE INDEX extraction_jobs_backlog
    ON extraction_jobs (priority, tenant_id, available_at)
    WHERE state IN ('READY', 'RETRY_SCHEDULED');

DROP INDEX extraction_jobs_eligible;
