"""Metrics of the review workflow, served on the edge's /metrics (bounded labels only)."""

from __future__ import annotations

from prometheus_client import Counter

CLAIMS = Counter("fatura_review_claims_total", "Review tasks claimed by a reviewer.")
DECISIONS = Counter(
    "fatura_review_decisions_total",
    "Review decisions by task kind (validation, erp_rejected) and decision (approved, corrected, rejected).",
    ["kind", "decision"],
)
