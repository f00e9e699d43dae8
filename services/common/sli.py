"""The completion SLI (seed 000, "Üretim kabulü"): time from acceptance to a job's final state.

Observed by the process that writes the transition, after its transaction committed: the
inference worker (succeeded, review_required, failed), the inference scheduler (failed: lease or
deadline) and the edge (a reviewer's decision, cancellation). The automatic outcome and the
review are separate series, so failing fast or sending every document to review never improves
the completion objective: ``outcome="succeeded"`` under the target is good, everything else in
``fatura_job_completion_seconds`` counts against it, and the review rate is the share with
``outcome="review_required"``. A reviewer's decision is measured on its own histogram.
"""

from __future__ import annotations

from prometheus_client import Histogram

from services.common import states

# From a second to a day: an interactive job finishes in seconds, a batch may wait hours.
BUCKETS = (1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)

OUTCOMES = {
    states.SUCCEEDED: "succeeded",
    states.REVIEW_REQUIRED: "review_required",
    states.FAILED_TERMINAL: "failed",
    states.CANCELLED: "cancelled",
}

COMPLETION = Histogram(
    "fatura_job_completion_seconds",
    "Seconds from acceptance to the end of automatic processing, by priority and outcome "
    "(succeeded, review_required, failed, cancelled); each job is observed once",
    ["priority", "outcome"],
    buckets=BUCKETS,
)
REVIEW_RESOLUTION = Histogram(
    "fatura_review_resolution_seconds",
    "Seconds from acceptance to a reviewer's decision on a job that required review, by priority "
    "and decision (approved, corrected, rejected)",
    ["priority", "decision"],
    buckets=BUCKETS,
)


def observe_completion(priority: str, state: str, seconds: float) -> None:
    """Record one job's end of automatic processing; states that are not an end are ignored."""
    outcome = OUTCOMES.get(state)
    if outcome is not None:
        COMPLETION.labels(priority, outcome).observe(max(0.0, seconds))


def observe_review(priority: str, decision: str, seconds: float) -> None:
    REVIEW_RESOLUTION.labels(priority, decision).observe(max(0.0, seconds))
