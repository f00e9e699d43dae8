"""Prometheus metrics of the HTTP edge (multiprocess-safe: counters and histograms only)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

REQUESTS = Counter(
    "fatura_http_requests_total", "HTTP requests by route and status", ["method", "route", "status"]
)
LATENCY = Histogram(
    "fatura_http_request_seconds",
    "HTTP request latency by route",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
