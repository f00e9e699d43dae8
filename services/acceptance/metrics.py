"""Prometheus metrics of the acceptance service (multiprocess-safe: counters only)."""

from __future__ import annotations

from prometheus_client import Counter

JOBS_ACCEPTED = Counter("fatura_jobs_accepted_total", "Extraction jobs created", ["priority"])
JOBS_CANCELLED = Counter("fatura_jobs_cancelled_total", "Extraction jobs cancelled by their tenant")
IDEMPOTENT_REPLAYS = Counter(
    "fatura_idempotent_replays_total", "Requests answered with an existing job (same key and body)"
)
IDEMPOTENCY_CONFLICTS = Counter(
    "fatura_idempotency_conflicts_total", "Requests reusing a key with a different body (409)"
)
ADMISSION_REJECTIONS = Counter(
    "fatura_admission_rejections_total",
    "Jobs refused by admission, by the limit that refused them",
    ["limit"],
)
BATCHES_ACCEPTED = Counter("fatura_batches_accepted_total", "Extraction batches created", ["priority"])
BATCHES_CLOSED = Counter(
    "fatura_batches_closed_by_sweep_total",
    "Batches the relay's sweep closed because their last items finished at the same instant",
)
