"""Prometheus metrics of the ``jobs-grpc`` process (besides the acceptance counters it shares with
the HTTP edge: jobs accepted, replays, conflicts, admission refusals)."""

from __future__ import annotations

from prometheus_client import Histogram

RPC_SECONDS = Histogram(
    "fatura_jobs_grpc_rpc_seconds",
    "Server-side handling time of a JobService RPC, by method and status code",
    ["method", "code"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
