-- The operator's view of a job (GET /v1/ops/jobs/{id}): each attempt row keeps the raw error text
-- (a provider's own words, which the tenant never sees: services/common/job_errors.py) and the
-- worker that made it. Rows written before this migration have neither.
ALTER TABLE job_attempts
    ADD COLUMN error_message text CHECK (octet_length(error_message) <= 4096),
    ADD COLUMN worker_id     text CHECK (octet_length(worker_id) <= 256);

-- The edge reads the attempt log and the inbox quarantine for operator keys only; it writes neither.
GRANT SELECT ON job_attempts, inbox_quarantine TO fatura_edge;
