"""Prometheus metrics of the inference worker and scheduler."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

CLAIMS = Counter("fatura_inference_claims_total", "Claim tries of execution slots, by result", ["result"])
DEFERRALS = Counter(
    "fatura_inference_deferrals_total", "Jobs deferred because the limiter denied a permit", ["reason"]
)
ATTEMPTS = Counter(
    "fatura_inference_attempts_total", "Attempts finished by this worker, by the job's next state", ["state"]
)
STALE_COMPLETIONS = Counter(
    "fatura_inference_stale_completions_total",
    "Completions discarded because the worker no longer owned the job (fence or lease lost)",
)
REFUSED = Counter(
    "fatura_inference_refused_total",
    "Jobs failed at claim because the limiter said no wait could admit them (bigger than the pool)",
)
TENANT_LOADS_READS = Counter(
    "fatura_inference_tenant_loads_reads_total",
    "Claims that read every tenant's load from the database (none kept, or none startable among them)",
)
SUPPLIER_READS = Counter(
    "fatura_inference_supplier_reads_total",
    "Claims that read their tenant's master suppliers (none kept at the tenant's version)",
)
LEASES_LOST = Counter(
    "fatura_inference_leases_lost_total", "Running jobs whose lease a heartbeat found taken away"
)
INGEST_WAKEUPS = Counter(
    "fatura_inference_ingest_wakeups_total",
    "How an ingested job request woke the workers: a free slot of this process (local), a run "
    "wake-up sent to any worker (sent), neither as one was sent lately (coalesced), or not at all "
    "as a slot had already claimed the job (already_claimed)",
    ["how"],
)
RELAY_NUDGES = Counter(
    "fatura_inference_relay_nudges_total",
    "How completions woke the relay: NOTIFYs carried in a completion's own transaction (carried), "
    "NOTIFY transactions for completions that carried none (sent), and completions that carried "
    "none but a later carried one covered (covered)",
    ["how"],
)
IN_FLIGHT = Gauge("fatura_inference_in_flight", "Jobs this worker process is running now")
ATTEMPT_SECONDS = Histogram(
    "fatura_inference_attempt_seconds",
    "Wall time of one attempt, from claim to completion",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 45, 90),
)
REAPED = Counter(
    "fatura_scheduler_reaped_total", "Expired leases handled by the reaper, by result", ["state"]
)
EXPIRED = Counter("fatura_scheduler_deadline_expired_total", "Jobs failed because their deadline passed")
WAKEUPS = Counter("fatura_scheduler_wakeups_sent_total", "Wake-ups sent by the scheduler's top-up")
RUNNABLE = Gauge(
    "fatura_scheduler_eligible_jobs",
    "Jobs due to run now (READY or RETRY_SCHEDULED, available_at passed), by priority: exact, not capped",
    ["priority"],
)
OLDEST_ELIGIBLE = Gauge(
    "fatura_scheduler_oldest_eligible_age_seconds",
    "How long the oldest due job of each priority has waited to run (0 when none is due)",
    ["priority"],
)
