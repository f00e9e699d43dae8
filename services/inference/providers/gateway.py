"""The provider gateway: one attempt across a model's routing chain (DESIGN §5.6, seed 001).

For each channel, cheapest first: skip it if its circuit breaker is open (nothing sent), ask the
limiter for a permit on its pool (a denial moves on to the next channel), make one hop, release
the permit with what happened, and fail over only on a retryable error that came before the stream
gate committed to the channel. If every usable channel was denied, nothing was sent and the attempt
is deferred (``deferred_ms``), which is not an attempt. One ``Gateway`` per process, shared by the
worker's threads; each thread sends through a connection pool of its own (``ThreadPools``).
"""

from __future__ import annotations

import logging
import ssl
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

import httpx
from prometheus_client import Counter, Histogram

from services.common.metric_children import Children
from services.inference.providers.base import (
    ErrorClass,
    Hop,
    PermitDenied,
    PermitGranted,
    Permits,
    ProviderRequest,
    ProviderResult,
)
from services.inference.providers.breaker import Report, Verdict
from services.inference.providers.breaker_store import RedisBreakers, connect
from services.inference.providers.cancel import cancellable_transport
from services.inference.providers.catalog import Catalog, Channel, load_catalog
from services.inference.providers.classify import FAILOVER
from services.inference.providers.exchange import HopOutcome, exchange
from services.inference.providers.settings import GatewaySettings
from services.inference.providers.watchdog import Watchdog

log = logging.getLogger(__name__)

HOPS = Counter("fatura_provider_hops_total", "Hops to provider channels by outcome", ["channel", "outcome"])
TIME_TO_FIRST_TOKEN = Histogram(
    "fatura_provider_time_to_first_token_seconds",
    "From sending a streamed request to its first content frame, by channel",
    ["channel"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 45),
)
INTER_TOKEN = Histogram(
    "fatura_provider_inter_token_latency_seconds",
    "Between consecutive content frames of a streamed answer (one token each at vLLM), by channel",
    ["channel"],
    buckets=(0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1, 2.5),
)
TOKENS = Counter(
    "fatura_provider_tokens_total",
    "Tokens the provider reported, by channel and kind (input, output)",
    ["channel", "kind"],
)
HOP_SECONDS = Histogram(
    "fatura_provider_hop_seconds",
    "Duration of hops that sent a request",
    ["channel"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 45, 90, 240),
)

_HOPS = Children(HOPS)
_HOP_SECONDS = Children(HOP_SECONDS)
_TIME_TO_FIRST_TOKEN = Children(TIME_TO_FIRST_TOKEN)
_INTER_TOKEN = Children(INTER_TOKEN)
_TOKENS = Children(TOKENS)


def http_transport(settings: GatewaySettings, verify: ssl.SSLContext | bool = True) -> httpx.HTTPTransport:
    """A connection pool; hops send through it without an ``httpx.Client``, so no redirect is
    followed and no cookie kept. ``retries=0``: httpx's only retry is of failed connects, and
    retries live in one layer, the database's schedule."""
    limits = httpx.Limits(
        max_connections=settings.max_connections, max_keepalive_connections=settings.max_connections
    )
    return cancellable_transport(retries=0, limits=limits, verify=verify)


class ThreadPools(httpx.BaseTransport):
    """One connection pool per calling thread, made at its first request.

    A slot makes one call at a time, so its pool holds one connection per endpoint it calls. One
    pool shared by sixteen slot threads cost a fifth more CPU per call (measured): httpcore checks
    every pooled connection, a ``poll()`` each, under one lock, when a request starts and again when
    it ends. The pools share one SSL context (building one reads the CA bundle). The worker's slot
    threads live as long as the process; the pool of a thread that ended is closed when another
    thread makes its pool, and every pool by ``close()``.
    """

    def __init__(self, make: Callable[[], httpx.HTTPTransport]) -> None:
        self._make = make
        self._local = threading.local()
        self._lock = threading.Lock()
        self._pools: dict[threading.Thread, httpx.HTTPTransport] = {}

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        pool: httpx.HTTPTransport | None = getattr(self._local, "pool", None)
        if pool is None:
            pool = self._local.pool = self._new_pool()
        return pool.handle_request(request)

    def _new_pool(self) -> httpx.HTTPTransport:
        pool = self._make()
        with self._lock:
            ended = [thread for thread in self._pools if not thread.is_alive()]
            left = [self._pools.pop(thread) for thread in ended]
            self._pools[threading.current_thread()] = pool
        for old in left:
            old.close()
        return pool

    def close(self) -> None:
        """Close every thread's connections (as with one httpx transport, a later request opens
        new ones, which a later ``close()`` closes too)."""
        with self._lock:
            pools = list(self._pools.values())
        for pool in pools:
            pool.close()


def thread_pools(settings: GatewaySettings) -> ThreadPools:
    """The gateway's transport: ``http_transport`` per thread, with one SSL context for all."""
    verify = httpx.create_ssl_context()
    return ThreadPools(lambda: http_transport(settings, verify))


class Gateway:
    """``Provider`` over the routing chains of a ``Catalog``."""

    def __init__(
        self,
        catalog: Catalog,
        settings: GatewaySettings,
        breakers: RedisBreakers,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.catalog = catalog
        self.settings = settings
        self.breakers = breakers
        self._transport = transport or thread_pools(settings)
        self._watchdog = Watchdog()

    @classmethod
    def from_settings(cls, settings: GatewaySettings | None = None) -> Gateway:
        """Build after forking: the client's connections and the Redis pool are per process."""
        settings = settings or GatewaySettings.from_env()
        breakers = RedisBreakers(
            connect(settings.redis_url),
            settings.breaker_prefix,
            settings.breaker,
            healthy_cache_ms=settings.breaker_healthy_cache_ms,
        )
        return cls(load_catalog(settings), settings, breakers)

    def close(self) -> None:
        self._transport.close()

    def complete(self, request: ProviderRequest, permits: Permits) -> ProviderResult:
        chain = self.catalog.chain(request.model)
        if chain is None:
            return ProviderResult(
                None, [], ErrorClass.NOT_FOUND, f"no routing chain for model {request.model!r}"
            )
        budget = request.deadline_s if request.deadline_s > 0 else self.settings.attempt_deadline_s
        deadline = time.monotonic() + budget
        hops: list[Hop] = []
        waits: list[int] = []  # until a skipped channel may be usable again
        denials: list[str] = []
        last: HopOutcome | None = None
        for channel in chain:
            if request.cancel is not None and request.cancel.cancelled:
                last = HopOutcome(ErrorClass.CANCELLED, sent=False, message="the worker lost the job")
                break
            if time.monotonic() >= deadline:
                last = HopOutcome(ErrorClass.DEADLINE, sent=False, message="the attempt's deadline passed")
                break
            admission = self.breakers.admit(channel.name)
            if not admission.allowed:
                hops.append(_skipped(channel, "breaker_open", admission.wait_ms))
                waits.append(admission.wait_ms)
                continue
            trial = admission.verdict is Verdict.TRIAL
            grant = permits.acquire(channel.pool)
            if isinstance(grant, PermitDenied):
                if trial:
                    self.breakers.report(channel.name, Report.RELEASE, trial=True)
                hops.append(_skipped(channel, f"limiter:{grant.reason}", grant.retry_after_ms))
                waits.append(grant.retry_after_ms)
                denials.append(grant.reason)
                continue
            last, hop = self._hop(channel, request, grant, permits, deadline, trial)
            hops.append(hop)
            if last.error_class is None:
                return ProviderResult(last.content, hops, retry_after_ms=_largest_retry_after(hops))
            if last.error_class not in FAILOVER or last.committed:
                break
        return self._failed(request, hops, last, waits, denials)

    def _hop(
        self,
        channel: Channel,
        request: ProviderRequest,
        grant: PermitGranted,
        permits: Permits,
        deadline: float,
        trial: bool,
    ) -> tuple[HopOutcome, Hop]:
        started_at, t0, sent_at = datetime.now(UTC), time.perf_counter(), time.monotonic()
        outcome = exchange(
            self._transport,
            channel,
            request,
            deadline=deadline,
            settings=self.settings,
            watchdog=self._watchdog,
        )
        elapsed = time.perf_counter() - t0
        ended_at = datetime.now(UTC)
        permits.release(grant, *_settlement(outcome))
        error = outcome.error_class
        if error is ErrorClass.RATE_LIMITED:
            permits.throttle(channel.pool, outcome.retry_after_ms or self.settings.default_retry_after_ms)
        if error is ErrorClass.CANCELLED:
            # We cut the call: says nothing about the channel's health.
            self.breakers.report(channel.name, Report.RELEASE, trial=trial)
        elif error in FAILOVER or outcome.silent:
            if self.breakers.report(channel.name, Report.FAILURE, trial=trial) is Verdict.OPEN:
                log.warning("channel %s is open after %s", channel.name, error)
        else:
            self.breakers.report(
                channel.name, Report.RELEASE if error is ErrorClass.DEADLINE else Report.SUCCESS, trial=trial
            )
        label = "ok" if error is None else error.value
        _HOPS(channel.name, label).inc()
        if outcome.sent:
            _HOP_SECONDS(channel.name).observe(elapsed)
        ttft_ms, itl_ms = None, None
        if outcome.first_token_at is not None:
            ttft = max(0.0, outcome.first_token_at - sent_at)
            _TIME_TO_FIRST_TOKEN(channel.name).observe(ttft)
            ttft_ms = round(ttft * 1000)
        if outcome.token_gaps:
            itl = _INTER_TOKEN(channel.name)
            for gap in outcome.token_gaps:
                itl.observe(gap)
            itl_ms = round(sum(outcome.token_gaps) / len(outcome.token_gaps) * 1000, 3)
        if outcome.input_tokens:
            _TOKENS(channel.name, "input").inc(outcome.input_tokens)
        if outcome.output_tokens:
            _TOKENS(channel.name, "output").inc(outcome.output_tokens)
        if error is not None:
            log.info(
                "hop %s %s: %s %s %s",
                request.request_id,
                channel.name,
                label,
                outcome.http_status,
                outcome.message,
            )
        hop = Hop(
            channel=channel.name,
            model=channel.upstream_model,
            started_at=started_at,
            ended_at=ended_at,
            outcome=label,
            http_status=outcome.http_status,
            error_class=error,
            retry_after_ms=outcome.retry_after_ms,
            input_tokens=outcome.input_tokens,
            output_tokens=outcome.output_tokens,
            latency_ms=round(elapsed * 1000),
            sent=outcome.sent,
            answered_model=outcome.model,
            error_message=outcome.message if error is not None else None,
            time_to_first_token_ms=ttft_ms,
            inter_token_ms=itl_ms,
        )
        return outcome, hop

    def _failed(
        self,
        request: ProviderRequest,
        hops: list[Hop],
        last: HopOutcome | None,
        waits: list[int],
        denials: list[str],
    ) -> ProviderResult:
        if last is None and denials:
            # Nothing left the worker and some channel only lacked a permit: defer, not an attempt.
            return ProviderResult(None, hops, deferred_ms=min(waits), deferred_reason=",".join(denials))
        if last is None:
            message = f"every channel of {request.model!r} is open (circuit breaker)"
            return ProviderResult(None, hops, ErrorClass.NO_CHANNEL, message, retry_after_ms=min(waits))
        return ProviderResult(
            None, hops, last.error_class, last.message or str(last.error_class), _largest_retry_after(hops)
        )


def _settlement(outcome: HopOutcome) -> tuple[str, int, int]:
    """How the limiter settles a hop's permit: (outcome, input tokens, output tokens)."""
    if not outcome.sent:
        return "NOT_SENT", 0, 0
    if outcome.error_class is None:
        if outcome.input_tokens is None or outcome.output_tokens is None:
            return "UNKNOWN", 0, 0  # answered but usage unreported: keep the reservation, never guess low
        return "COMPLETED", outcome.input_tokens, outcome.output_tokens
    status = outcome.http_status
    if status is not None and not 200 <= status < 300:
        return "COMPLETED", 0, 0  # the provider refused before running the model
    return "UNKNOWN", 0, 0  # sent and no complete answer: it may have run (and billed)


def _skipped(channel: Channel, reason: str, wait_ms: int) -> Hop:
    now = datetime.now(UTC)
    return Hop(
        channel=channel.name,
        model=channel.upstream_model,
        started_at=now,
        ended_at=now,
        outcome="skipped",
        retry_after_ms=wait_ms,
        latency_ms=0,
        sent=False,
        skip_reason=reason,
    )


def _largest_retry_after(hops: list[Hop]) -> int | None:
    given = [h.retry_after_ms for h in hops if h.sent and h.retry_after_ms is not None]
    return max(given) if given else None
