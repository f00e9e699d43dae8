"""Execution slots: where the model calls happen, outside any transaction and any broker delivery.

A ``run`` wake-up only starts a slot; the actor returns (and its message is acked) at once. A slot
claims a job by fair share, runs the attempt, completes it under its fence, and claims again until
nothing is due or the limiter says wait. A heartbeat thread renews the leases of the jobs this
process runs and the limiter permits they hold; a job whose lease was taken away is left to its
new owner (its completion will be refused as stale).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from psycopg_pool import ConnectionPool

from services.common import faults, logs, tracing
from services.common.failures import is_transient
from services.inference import metrics
from services.inference.claims import (
    Claimed,
    ClaimedJob,
    Claims,
    Completion,
    Deferred,
    Refused,
    Started,
    request_key,
    tenant_text,
)
from services.inference.nudge import RelayNudge
from services.inference.outcomes import WORKER_ERROR, decide
from services.inference.permits import AttemptPermits
from services.inference.prompt import build_messages
from services.inference.providers.base import Provider, ProviderRequest, ProviderResult
from services.inference.providers.cancel import CallScope
from services.inference.retry import RetryPolicy
from services.inference.settings import InferenceSettings
from services.inference.suppliers import SupplierCache
from services.inference.validation import validate
from services.limiter import Denial, DenyReason, Grant, LimiterClient, LimiterError, Outcome, PermitNotHeld

log = logging.getLogger(__name__)

# Denials that say the pool itself is full, not one tenant: no other job could be started now.
POOL_WIDE = frozenset({DenyReason.RPM, DenyReason.TPM, DenyReason.IN_FLIGHT, DenyReason.COOLDOWN})
T = TypeVar("T")
# A pool that reopens within this many seconds wakes the worker itself (see _wake_when_open).
REWAKE_MAX_SECONDS = 5.0


@dataclass
class _Owned:
    fence: int
    permits: AttemptPermits
    call: CallScope
    # Set when the call has ended and the slot goes on to write the outcome. A heartbeat that then
    # finds the lease gone has most likely met the slot's own completion; if the lease was really
    # taken, the completion finds its fence stale and says so.
    settling: bool = False


class Executor:
    def __init__(
        self,
        settings: InferenceSettings,
        pool: ConnectionPool[Any],
        limiter: LimiterClient,
        provider: Provider,
    ) -> None:
        self._s = settings
        self._pool = pool
        self._limiter = limiter
        self._provider = provider
        self._nudge = RelayNudge(pool)
        self._claims = Claims(
            pool,
            worker_id=settings.worker_id,
            model=settings.model,
            lease_seconds=settings.lease_seconds,
            aging_seconds=settings.priority_aging_seconds,
            nudge=self._nudge,
            suppliers=SupplierCache(settings.supplier_cache),
            loads_seconds=settings.tenant_loads_seconds,
        )
        self._policy = RetryPolicy(
            max_attempts=settings.max_attempts,
            base_seconds=settings.retry_base_seconds,
            cap_seconds=settings.retry_cap_seconds,
            attempt_seconds=settings.attempt_deadline_seconds,
            margin_seconds=settings.deadline_margin_seconds,
        )
        self._slots = threading.BoundedSemaphore(settings.concurrency)
        self._threads = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="slot")
        self._owned: dict[uuid.UUID, _Owned] = {}
        self._owned_lock = threading.Lock()
        self._stopping = threading.Event()
        self._pool_closed_until = 0.0  # monotonic; a float store is atomic under the GIL
        # One timer that wakes this worker when a pool that turned it away reopens.
        self._rewake_lock = threading.Lock()
        self._rewake: threading.Timer | None = None
        self._rewake_at = 0.0
        self._heartbeat = threading.Thread(target=self._beat, name="heartbeat", daemon=True)
        self._heartbeat.start()

    @property
    def lease_ms(self) -> int:
        return int(self._s.lease_seconds * 1000)

    def wake(self, wait_seconds: float | None = None) -> bool:
        """Start a slot if one frees up within the wait (``FATURA_SLOT_WAIT_SECONDS`` unless given;
        0: only a slot free now); False when the wake-up is dropped."""
        if time.monotonic() < self._pool_closed_until:
            # The limiter just said the whole pool is full or cooling down: a claim now would only
            # lock a job, ask again and defer it. The scheduler's top-up wakes the work later.
            metrics.CLAIMS.labels("pool_closed").inc()
            return False
        wait = self._s.slot_wait_seconds if wait_seconds is None else wait_seconds
        if self._stopping.is_set():
            return False
        if not (self._slots.acquire(timeout=wait) if wait > 0 else self._slots.acquire(blocking=False)):
            return False
        try:
            self._threads.submit(self._slot)
        except RuntimeError:  # shutting down
            self._slots.release()
            return False
        return True

    def stop(self) -> None:
        self._stopping.set()
        with self._rewake_lock:
            if self._rewake is not None:
                self._rewake.cancel()
        self._threads.shutdown(wait=True, cancel_futures=True)
        self._nudge.close()

    def _slot(self) -> None:
        try:
            if self._stopping.is_set():
                return
            # After the first claim, each next one rides in the completion's transaction (none
            # once stopping); a job claimed there is run even if the stop came meanwhile.
            claimed = self._claims.claim(self._acquire, self._release_unused)
            while claimed is not None:
                if isinstance(claimed, Deferred):
                    metrics.CLAIMS.labels("deferred").inc()
                    if claimed.reason in POOL_WIDE:
                        self._pool_closed_until = time.monotonic() + claimed.retry_after_ms / 1000
                        self._wake_when_open(claimed.retry_after_ms / 1000)
                    return
                if isinstance(claimed, Refused):
                    metrics.CLAIMS.labels("refused").inc()
                    # Failed in the claim: the next job may fit.
                    stopping = self._stopping.is_set()
                    claimed = None if stopping else self._claims.claim(self._acquire, self._release_unused)
                    continue
                metrics.CLAIMS.labels("started").inc()
                claimed = self._run(claimed)
            if not self._stopping.is_set():
                metrics.CLAIMS.labels("nothing_due").inc()
        except Exception:
            # The job, if one was claimed, keeps its lease until it expires; the reaper then
            # reschedules it. The slot itself must survive for the next wake-up.
            log.exception("execution slot failed")
        finally:
            self._slots.release()

    def _wake_when_open(self, seconds: float) -> None:
        """Wake this worker once the pool that turned a claim away reopens, when that is soon.

        The deferred job is due again then; waiting for the scheduler's next top-up instead left a
        paced pool idle for most of each interval (one request every 60/RPM s, no burst: 44% of
        the rate). One timer per worker, moved earlier when a sooner reopening is heard; a later
        one is left to the timer already set, and a long cooldown to the scheduler.
        """
        if seconds > REWAKE_MAX_SECONDS or self._stopping.is_set():
            return
        at = time.monotonic() + seconds
        with self._rewake_lock:
            # A timer already past its moment (its thread may still be waiting in wake() for a
            # slot) is not waiting for this reopening: set a new one beside it.
            pending = self._rewake is not None and self._rewake_at > time.monotonic()
            if pending and self._rewake is not None:
                if self._rewake_at <= at:
                    return
                self._rewake.cancel()
            # A hair after the reopening, so the wake-up does not meet the pool still closed.
            timer = threading.Timer(seconds + 0.002, self._rewoken)
            timer.daemon = True
            self._rewake, self._rewake_at = timer, at
            timer.start()

    def _rewoken(self) -> None:
        left = self._pool_closed_until - time.monotonic()
        if left > 0:
            # A later denial closed the pool past this timer's moment (its own timer was left to
            # this one): wake() would drop the wake-up and nothing would be left to wake the worker.
            self._wake_when_open(left)
            return
        metrics.CLAIMS.labels("rewoken").inc()
        self.wake()

    def _acquire(self, tenant_id: uuid.UUID, estimated_tokens: int, key: str) -> Grant | Denial:
        def ask(key: str) -> Grant | Denial:
            return self._limiter.acquire(
                self._s.limiter_pool,
                tenant_text(tenant_id),
                self._prompt_estimate(estimated_tokens),
                self._s.max_output_tokens,
                lease_ms=self.lease_ms,
                request_key=key,
            )

        try:
            return ask(key)
        except PermitNotHeld:
            # The key's permit was granted and then given back (its claim rolled back, or a
            # timed-out Acquire was settled): that start never happened, so ask afresh.
            return ask(f"{key}:{uuid.uuid4().hex[:8]}")

    def _prompt_estimate(self, estimated_tokens: int) -> int:
        """A job's estimate is its prompt plus the output cap (services/acceptance/admission.py);
        the limiter adds the cap itself, so a local pool holds prompt + max output, not two caps."""
        return max(0, estimated_tokens - self._s.max_output_tokens)

    def _release_unused(self, grant: Grant) -> None:
        """A permit granted inside a claim whose transaction then failed: nothing was sent."""
        try:
            self._limiter.release(grant.permit_id, Outcome.NOT_SENT)
        except LimiterError as exc:
            log.warning(
                "could not release unused permit %s (its lease will end it): %s", grant.permit_id, exc
            )

    def _run(self, started: Started) -> Claimed:
        """Run the attempt; returns the slot's next claim, made in the completion's transaction."""
        job = started.job
        attributes: dict[str, str | int] = {"job_id": job.job_text, "attempt": job.attempt}
        attributes["fence"] = job.fence
        with (
            tracing.span("inference attempt", job.traceparent, attributes),
            logs.bound(job_id=job.job_text, tenant_id=job.tenant_text, attempt=job.attempt, fence=job.fence),
        ):
            return self._run_owned(started)

    def _run_owned(self, started: Started) -> Claimed:
        job = started.job
        permits = AttemptPermits(
            self._limiter,
            tenant=job.tenant_text,
            estimated_input_tokens=self._prompt_estimate(job.estimated_tokens),
            max_output_tokens=self._s.max_output_tokens,
            lease_ms=self.lease_ms,
            primary_pool=self._s.limiter_pool,
            primary=started.grant,
            request_key=request_key(job.job_text, job.fence),
        )
        call = CallScope()
        owned = _Owned(job.fence, permits, call)
        with self._owned_lock:
            self._owned[job.job_id] = owned
        metrics.IN_FLIGHT.inc()
        t0 = time.monotonic()
        try:
            context = started.context
            request = ProviderRequest(
                model=self._s.model,
                messages=build_messages(context.source_text, job.schema_version),
                max_output_tokens=self._s.max_output_tokens,
                deadline_s=self._s.attempt_deadline_seconds,
                request_id=f"{job.job_text}:{job.attempt}",
                cancel=call,
            )
            try:
                result = self._provider.complete(request, permits)
            except Exception as exc:  # a bug in the call path must not lose the job: retry it
                log.exception("job %s: provider call failed unexpectedly", job.job_id)
                result = ProviderResult(None, error_class=None, error_message=f"{WORKER_ERROR}: {exc}"[:500])
            owned.settling = True
            _trace_hops(result)
            faults.point(self._s.common.faults, faults.CRASH_AFTER_PROVIDER_RESPONSE)
            verdict = None
            if result.content is not None:
                with tracing.span("validation") as span:
                    verdict = validate(result.content, context)
                    span.set_attribute("validation.outcome", str(verdict.outcome))
            completion = decide(job, result, verdict, datetime.now(UTC), self._policy)
            # Settle what the gateway left held before the next claim asks for a permit.
            permits.close()
            claimed = self._complete(job, completion)
            metrics.ATTEMPTS.labels(completion.state).inc()
            return claimed
        finally:
            permits.close()
            with self._owned_lock:
                self._owned.pop(job.job_id, None)
            metrics.IN_FLIGHT.dec()
            metrics.ATTEMPT_SECONDS.observe(time.monotonic() - t0)

    def _complete(self, job: ClaimedJob, completion: Completion) -> Claimed:
        """Write the outcome and, in the same transaction, claim the slot's next job (none while
        stopping). The call was made (and may be billed): its answer is worth keeping through a
        blip, and through a failure of the next claim, after which the outcome is written alone."""
        what = f"job {job.job_text}: writing its outcome"
        if self._stopping.is_set():
            self._through_blips(what, lambda: self._claims.complete(job, completion))
            return None
        then = (self._acquire, self._release_unused)
        try:
            _, claimed = self._through_blips(
                what, lambda: self._claims.complete_then_claim(job, completion, then)
            )
            return claimed
        except Exception as exc:
            if is_transient(exc):
                raise
            log.exception("job %s: the next claim failed; writing the outcome alone", job.job_id)
        self._through_blips(what, lambda: self._claims.complete(job, completion))
        return None

    def _through_blips(self, what: str, step: Callable[[], T]) -> T:
        """Run one database step of an owned job, waiting out a transient failure (with backoff)
        for as long as the job's lease could still hold; after that the reaper owns the job."""
        give_up = time.monotonic() + self._s.lease_seconds
        delay = 0.2
        while True:
            try:
                return step()
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() + delay >= give_up or self._stopping.is_set():
                    raise
                log.warning("%s failed (%s: %s); retrying in %.1fs", what, type(exc).__name__, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _beat(self) -> None:
        while not self._stopping.wait(self._s.heartbeat_seconds):
            with self._owned_lock:
                owned = dict(self._owned)
            if not owned:
                continue
            try:
                lost = self._claims.renew({job_id: o.fence for job_id, o in owned.items()})
            except Exception:
                log.exception("heartbeat could not renew leases")
                continue
            for job_id in lost:
                if owned[job_id].settling:
                    # No call to cut: the slot is writing the outcome, or has written it between
                    # the snapshot above and the renewal, which then found the job finished.
                    continue
                metrics.LEASES_LOST.inc()
                log.warning("job %s: lease lost or job cancelled; its call is cut", job_id)
                # Nobody owns the call any more: cut it, so its permit is released now rather
                # than held (and renewed by nobody) until the provider answers.
                owned[job_id].call.cancel()
            for job_id, o in owned.items():
                if job_id not in lost:
                    o.permits.renew()


def _trace_hops(result: ProviderResult) -> None:
    """One span per exchange with a provider channel, timed by the gateway, under the attempt's."""
    for hop in result.hops:
        attributes: dict[str, str | int] = {
            "channel": hop.channel,
            "model": hop.model,
            "outcome": hop.outcome,
        }
        for key, value in (
            ("http.response.status_code", hop.http_status),
            ("gen_ai.usage.input_tokens", hop.input_tokens),
            ("gen_ai.usage.output_tokens", hop.output_tokens),
        ):
            if value is not None:
                attributes[key] = value
        tracing.record_span(
            f"provider {hop.channel}", hop.started_at, hop.ended_at, attributes, error=hop.outcome != "ok"
        )
