-- One trace per job (services/common/tracing.py): the W3C traceparent of the request that accepted
-- a job, kept with the job so every later step (claim, limiter call, attempt, completion) is a
-- child of it, and with each delivery so its webhook attempts are too. NULL when the request
-- carried no trace and tracing is off. Table-level grants already cover the new columns.
ALTER TABLE extraction_jobs ADD COLUMN traceparent text;
ALTER TABLE deliveries ADD COLUMN traceparent text;
