"""Prometheus metrics of the limiter server; pool usage is read from Redis at scrape time."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from services.limiter.errors import LimiterError
from services.limiter.model import PoolStatus

log = logging.getLogger(__name__)

GRANTS = Counter(
    "fatura_limiter_grants_total", "Permits granted (a retried Acquire is counted once per call)", ["pool"]
)
DENIALS = Counter(
    "fatura_limiter_denials_total", "Acquires denied, by the dimension that denied", ["pool", "reason"]
)
RELEASES = Counter("fatura_limiter_releases_total", "Permits released, by outcome", ["pool", "outcome"])
THROTTLE_REPORTS = Counter(
    "fatura_limiter_throttle_reports_total",
    "Provider 429s reported; extended=true when the cooldown grew",
    ["pool", "extended"],
)
UNAUTHENTICATED = Counter(
    "fatura_limiter_unauthenticated_total",
    "LimiterService calls refused before the servicer ran: no token or a wrong one",
    ["method"],
)
RPC_SECONDS = Histogram(
    "fatura_limiter_rpc_seconds",
    "Server-side handling time of a limiter RPC, by method and status code; an Acquire or Release"
    " inside a Batch counts under its own method, with the time of its Batch",
    ["method", "code"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
)


@functools.lru_cache(maxsize=4096)
def labelled(metric: MetricWrapperBase, *values: str) -> Any:
    """``metric.labels(*values)``, remembered: the RPC path asks for the same few children for every
    call. Label values here are methods, codes and configured pools (a request naming an unknown
    pool fails before it is counted), so the cache holds few entries."""
    return metric.labels(*values)


class PoolCollector(Collector):
    """Reads every configured pool's status when Prometheus scrapes (held permits, window usage,
    cooldown), so the figures are never stale between RPCs."""

    def __init__(self, pools: Callable[[], list[str]], status: Callable[[str], PoolStatus]) -> None:
        self._pools = pools
        self._status = status

    def collect(self) -> Iterator[Metric]:
        families = {
            "in_flight": GaugeMetricFamily(
                "fatura_limiter_pool_in_flight", "Permits held now (leases not expired)", labels=["pool"]
            ),
            "in_flight_limit": GaugeMetricFamily(
                "fatura_limiter_pool_in_flight_limit", "Max permits held at once", labels=["pool"]
            ),
            "requests": GaugeMetricFamily(
                "fatura_limiter_pool_requests_in_window", "Requests in the sliding window", labels=["pool"]
            ),
            "requests_limit": GaugeMetricFamily(
                "fatura_limiter_pool_requests_limit", "Requests allowed per window (RPM)", labels=["pool"]
            ),
            "tokens": GaugeMetricFamily(
                "fatura_limiter_pool_tokens_in_window", "Tokens in the sliding window", labels=["pool"]
            ),
            "tokens_limit": GaugeMetricFamily(
                "fatura_limiter_pool_tokens_limit", "Tokens allowed per window (TPM)", labels=["pool"]
            ),
            "cooldown": GaugeMetricFamily(
                "fatura_limiter_pool_cooldown_remaining_seconds",
                "Time left in the pool's cooldown (0: none)",
                labels=["pool"],
            ),
        }
        headroom = GaugeMetricFamily(
            "fatura_limiter_pool_headroom",
            "What a pool can still grant now, by dimension (in_flight permits, requests and tokens "
            "in the window): the limit minus its use, never below 0",
            labels=["pool", "dimension"],
        )
        up = GaugeMetricFamily("fatura_limiter_redis_up", "1 when the last scrape could read Redis")
        ok = 1
        for pool in self._pools():
            try:
                status = self._status(pool)
            except LimiterError as exc:
                log.warning("pool status for metrics failed: %s", exc)
                ok = 0
                break
            families["in_flight"].add_metric([pool], status.in_flight.used)
            families["in_flight_limit"].add_metric([pool], status.in_flight.limit)
            families["requests"].add_metric([pool], status.requests.used)
            families["requests_limit"].add_metric([pool], status.requests.limit)
            families["tokens"].add_metric([pool], status.tokens.used)
            families["tokens_limit"].add_metric([pool], status.tokens.limit)
            remaining = 0.0
            if status.cooldown_until_ms is not None:
                remaining = max(0.0, (status.cooldown_until_ms - status.observed_at_ms) / 1000)
            families["cooldown"].add_metric([pool], remaining)
            for dimension, usage in (
                ("in_flight", status.in_flight),
                ("requests", status.requests),
                ("tokens", status.tokens),
            ):
                headroom.add_metric([pool, dimension], max(0, usage.limit - usage.used))
        up.add_metric([], ok)
        yield from families.values()
        yield headroom
        yield up
