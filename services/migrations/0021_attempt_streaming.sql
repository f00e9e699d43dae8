-- A streamed attempt's latency as the tenant's wait is made of it (issue 16, point 3): time to the
-- first token (queueing and prefill at the provider) and the mean gap between tokens (decode).
ALTER TABLE job_attempts
    ADD COLUMN time_to_first_token_ms integer CHECK (time_to_first_token_ms >= 0),
    ADD COLUMN inter_token_ms real CHECK (inter_token_ms >= 0);
