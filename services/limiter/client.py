"""Blocking limiter client for worker threads: a deadline on every call, and a client that never
fails open.

When the limiter (or the Redis behind it) cannot be reached within the deadline, ``acquire`` falls
back to the process's bounded emergency quota (``FATURA_LIMITER_EMERGENCY_SHARE``; default 0:
closed) and says so with a metric and a log line each time. Emergency permits are local: their
renew and release never go to the limiter.

Every call carries the shared token (``FATURA_LIMITER_TOKEN``) when one is set, over TLS when
``FATURA_LIMITER_TLS_CA`` is set. A refused token is a configuration error, never an outage: it
raises ``LimiterUnauthenticated`` (logged each time) and never opens the emergency quota.

Acquire and Release travel inside ``Batch`` RPCs: a call leaves at once when fewer than two
Batches are on the wire, else with the next one, together with the calls the process's other
threads made meanwhile. Each keeps its own deadline and its own answer; against a limiter without
``Batch`` the client falls back to one RPC per call.

``release_later`` does not wait: its Release waits up to ``_HOLD_S`` (half as long again while
Releases are held one after another) for company (typically the same thread's next Acquire, a
moment later) and leaves with it, so a job's Release and the next job's Acquire cost one round
trip. ``close()`` sends what is still held.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import Counter

from services.common import tracing
from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.limiter.config import load_config
from services.limiter.emergency import EmergencyQuota, is_emergency
from services.limiter.errors import (
    BackendError,
    InvalidArgument,
    LimiterError,
    LimiterUnauthenticated,
    LimiterUnavailable,
    NeverAdmittable,
    PermitNotFound,
    PermitNotHeld,
    RequestKeyConflict,
)
from services.limiter.ids import permit_id_for
from services.limiter.model import Denial, DenyReason, Dimension, Grant, Outcome, PoolStatus
from services.limiter.security import bearer_metadata, channel_credentials
from services.limiter.settings import LimiterSettings

# The limiter's public surface for other services (re-exported by ``services.limiter``).
__all__ = [
    "Denial",
    "DenyReason",
    "Dimension",
    "Grant",
    "LimiterClient",
    "LimiterError",
    "LimiterUnauthenticated",
    "LimiterUnavailable",
    "NeverAdmittable",
    "Outcome",
    "PermitNotHeld",
    "PoolStatus",
]

log = logging.getLogger(__name__)

EMERGENCY = Counter(
    "fatura_limiter_client_emergency_total",
    "Acquires answered from the local emergency quota because the limiter was unreachable",
    ["pool", "result"],
)
UNREACHABLE = Counter(
    "fatura_limiter_client_unreachable_total",
    "Limiter calls that got no answer within the deadline",
    ["method"],
)
UNAUTHENTICATED = Counter(
    "fatura_limiter_client_unauthenticated_total",
    "Limiter calls refused as UNAUTHENTICATED: FATURA_LIMITER_TOKEN is wrong or missing",
    ["method"],
)

ERROR_BY_STATUS: dict[grpc.StatusCode, type[LimiterError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: NeverAdmittable,
    grpc.StatusCode.NOT_FOUND: PermitNotFound,
    grpc.StatusCode.FAILED_PRECONDITION: PermitNotHeld,
    grpc.StatusCode.ALREADY_EXISTS: RequestKeyConflict,
    grpc.StatusCode.UNAVAILABLE: LimiterUnavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: LimiterUnavailable,
    grpc.StatusCode.UNAUTHENTICATED: LimiterUnauthenticated,
}
_MAX_ORPHANS = 1_000
_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}
_OUTCOME_VALUE = {outcome: pb.Outcome.Value(f"OUTCOME_{outcome.value}") for outcome in Outcome}
# Batch RPCs on the wire at once, and calls in one: while both lanes are busy, calls wait for the
# first to come back (a round trip at most), then leave together.
_BATCH_LANES = 2
_BATCH_MAX_ITEMS = 128
# How long a Release nobody waits for is held for an Acquire to travel with; a slot's next Acquire
# usually follows within a few milliseconds (the completion's transaction between them).
_HOLD_S = 0.010
# Holds in a row that found nothing held before the flusher sleeps until a Release wakes it.
_QUIET_HOLDS = 100
_CHANNEL_OPTIONS = [
    # Reconnect quickly once the limiter is back instead of staying in emergency mode for minutes.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Despite its name, grpc core reads this as the least time a connection attempt is given to
    # finish (TCP, TLS, the server's first HTTP/2 frame): at 100 ms a limiter that far away, or a
    # starved machine, made every attempt fail and every call UNAVAILABLE.
    ("grpc.min_reconnect_backoff_ms", 2_000),
    # Retries live in one layer (the caller's); the channel must not retry on its own.
    ("grpc.enable_retries", 0),
]


def translate(error: grpc.RpcError) -> LimiterError:
    code: grpc.StatusCode = error.code()
    details = error.details() or code.name
    return ERROR_BY_STATUS.get(code, BackendError)(f"{code.name}: {details}")


def _ms(timestamp: Any) -> int:
    return int(timestamp.seconds) * 1000 + int(timestamp.nanos) // 1_000_000


class _Failed(Exception):
    """A call's status other than OK: its own RPC's, its Batch's, or its item's in the Batch."""

    def __init__(self, code: grpc.StatusCode, details: str, *, sent: bool = True) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details
        self.sent = sent  # False: it never left this process (no lane before its deadline)


_Answered = Callable[[pb.BatchResult | None, _Failed | None], None]


class _Waiting:
    __slots__ = (
        "_latch",
        "answered",
        "deadline",
        "error",
        "finished",
        "held_until",
        "item",
        "result",
        "sent",
    )

    def __init__(self, item: pb.BatchItem, deadline: float, answered: _Answered | None = None) -> None:
        self.item = item
        self.deadline = deadline
        self.result: pb.BatchResult | None = None
        self.error: _Failed | None = None
        self.finished = False
        # Held until the call is answered: a bare lock costs a fraction of a threading.Event.
        self._latch = threading.Lock()
        self._latch.acquire()
        self.sent = False
        # A call nobody waits for: told its answer through ``answered``; may wait for company.
        self.answered = answered
        self.held_until = 0.0

    def finish(self) -> None:
        """Mark answered (``result`` or ``error`` set first) and wake its waiter."""
        self.finished = True
        self._latch.release()

    def wait(self, timeout_s: float) -> bool:
        """True once answered; False if ``timeout_s`` passed first. One waiter per call."""
        return self.finished or self._latch.acquire(timeout=max(timeout_s, 0.0))


class _Batcher:
    """Sends the calls of a process's threads as Batch RPCs, at most ``lanes`` on the wire at once.
    A call never waits for company: with a lane free it leaves at once (alone or with the calls
    queued before it); otherwise it leaves when a Batch comes back, with everything queued by then."""

    def __init__(self, stub: Any, metadata: Any, lanes: int, max_items: int, hold_s: float = _HOLD_S) -> None:
        self._stub = stub
        self._metadata = metadata
        self._lanes = lanes
        self._max_items = max_items
        self._hold_s = hold_s
        self._lock = threading.Lock()
        self._queue: list[_Waiting] = []
        self._in_flight = 0
        self._held = threading.Condition(self._lock)  # a held call queued, or the batcher closing
        # Only a flusher asleep until told (after _QUIET_HOLDS holds with nothing held) needs a new
        # held call to wake it: otherwise it looks again within a hold, before that call is due.
        self._flusher_idle = False
        self._closing = False
        self._flusher: threading.Thread | None = None

    def post(self, item: pb.BatchItem, timeout_s: float, answered: _Answered) -> None:
        """Queue ``item`` without waiting for it: it leaves with the next call, or alone after the
        hold; ``answered`` gets its result or its failure (on a gRPC or flusher thread)."""
        waiting = _Waiting(item, time.monotonic() + timeout_s, answered)
        waiting.held_until = time.monotonic() + self._hold_s
        with self._lock:
            if self._closing:
                batch = [waiting]
                waiting.sent = True
                self._in_flight += 1
            else:
                self._queue.append(waiting)
                if self._flusher is None:
                    self._flusher = threading.Thread(
                        target=self._flush_held, name="limiter-release", daemon=True
                    )
                    self._flusher.start()
                elif self._flusher_idle:
                    self._held.notify()
                return
        self._send(batch)

    def _flush_held(self) -> None:
        """Send held calls whose hold is over and that no call has taken along.

        Under load a Release is held nearly all the time, each soon taken along by an Acquire; a
        wake-up at each one's due time (and a notify at each post) cost the worker a context switch
        per job. So the flusher looks at most every half hold, and with nothing held it looks again
        after a hold, sleeping until told only once nothing was held for ``_QUIET_HOLDS`` holds.
        """
        with self._lock:
            quiet = 0
            while not self._closing:
                held = [w.held_until for w in self._queue if w.answered is not None]
                if not held:
                    if quiet < _QUIET_HOLDS:
                        quiet += 1
                        self._held.wait(self._hold_s)
                    else:
                        self._flusher_idle = True
                        self._held.wait()
                        self._flusher_idle = False
                        quiet = 0
                    continue
                quiet = 0
                due = min(held) - time.monotonic()
                if due > 0:
                    self._held.wait(max(due, self._hold_s / 2))
                    continue
                batch = self._take_locked()
                if batch:
                    self._lock.release()
                    try:
                        self._send(batch)
                    finally:
                        self._lock.acquire()
                else:
                    # Both lanes busy: what is queued leaves when a Batch comes back.
                    self._held.wait(self._hold_s)

    def close(self, timeout_s: float) -> None:
        """Send every held call now and wait (at most ``timeout_s``) until every Batch on the wire is
        answered: held calls already sent are still waiting for theirs, and the channel closing
        under them would cancel them (their permits then held until their leases end)."""
        with self._lock:
            self._closing = True
            self._held.notify_all()
            batch = self._take_locked()
        if batch:
            self._send(batch)
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while self._in_flight or self._queue:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._held.wait(left)

    def call(self, item: pb.BatchItem, timeout_s: float) -> pb.BatchResult:
        """The item's result; raises ``_Failed`` when the Batch failed or the deadline passed."""
        waiting = _Waiting(item, time.monotonic() + timeout_s)
        with self._lock:
            self._queue.append(waiting)
            batch = self._take_locked()
        if batch and all(w is waiting or w.answered is not None for w in batch):
            # Alone, or with calls nobody waits for: the call waits in its own thread, as a unary
            # RPC would (no hand-off to grpc's).
            self._send_here(batch, waiting)
        elif batch:
            self._send(batch)
        if not waiting.wait(timeout_s):
            with self._lock:
                if not waiting.sent:
                    self._queue.remove(waiting)
                    raise _Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "no Batch left in time", sent=False)
            if not waiting.finished:
                raise _Failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        if waiting.error is not None:
            raise waiting.error
        assert waiting.result is not None
        return waiting.result

    def _take_locked(self) -> list[_Waiting]:
        if self._in_flight >= self._lanes or not self._queue:
            return []
        batch = self._queue[: self._max_items]
        del self._queue[: self._max_items]
        for waiting in batch:
            waiting.sent = True
        self._in_flight += 1
        return batch

    def _send(self, batch: list[_Waiting]) -> None:
        # The Batch lives as long as its most patient call; each caller stops waiting at its own.
        timeout = max(w.deadline for w in batch) - time.monotonic()
        request = pb.BatchRequest(items=[w.item for w in batch])
        try:
            future = self._stub.Batch.future(request, timeout=max(timeout, 0.001), metadata=self._metadata)
        except Exception as exc:  # e.g. the channel is closed
            self._finish(batch, None, _Failed(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}"))
            return
        future.add_done_callback(lambda done: self._answered(batch, done))

    def _send_here(self, batch: list[_Waiting], caller: _Waiting) -> None:
        # The caller waits until its own deadline, not its passengers' (a held Release's is later):
        # a passenger that deadline cuts off travels again, on its own deadline. A Release sent
        # twice is answered as already released the second time.
        timeout = caller.deadline - time.monotonic()
        request = pb.BatchRequest(items=[w.item for w in batch])
        try:
            response = self._stub.Batch(request, timeout=max(timeout, 0.001), metadata=self._metadata)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                batch = self._requeue_passengers(batch, caller)
            self._finish(batch, None, _Failed(exc.code(), exc.details() or exc.code().name))
        except Exception as exc:  # e.g. the channel is closed
            self._finish(batch, None, _Failed(grpc.StatusCode.UNAVAILABLE, f"{type(exc).__name__}: {exc}"))
        else:
            self._check(batch, response)

    def _requeue_passengers(self, batch: list[_Waiting], caller: _Waiting) -> list[_Waiting]:
        """Queue again, first, the calls of ``batch`` nobody waits for whose own deadline is still
        ahead; the rest of the batch is returned, to be finished."""
        now = time.monotonic()
        again = [w for w in batch if w is not caller and w.answered is not None and w.deadline > now]
        if not again:
            return batch
        with self._lock:
            for waiting in again:
                waiting.sent = False
                waiting.held_until = now
            self._queue[:0] = again
        return [w for w in batch if w not in again]

    def _answered(self, batch: list[_Waiting], future: Any) -> None:
        try:
            response = future.result()
        except grpc.RpcError as exc:
            self._finish(batch, None, _Failed(exc.code(), exc.details() or exc.code().name))
        except Exception as exc:  # cancelled: the client is closing
            self._finish(batch, None, _Failed(grpc.StatusCode.CANCELLED, f"{type(exc).__name__}: {exc}"))
        else:
            self._check(batch, response)

    def _check(self, batch: list[_Waiting], response: pb.BatchResponse) -> None:
        if len(response.results) != len(batch):
            count = f"{len(response.results)} results for {len(batch)} items"
            self._finish(batch, None, _Failed(grpc.StatusCode.INTERNAL, count))
        else:
            self._finish(batch, list(response.results), None)

    def _finish(
        self, batch: list[_Waiting], results: list[pb.BatchResult] | None, error: _Failed | None
    ) -> None:
        for i, waiting in enumerate(batch):
            if results is not None:
                waiting.result = results[i]
            waiting.error = error
            waiting.finish()
            if waiting.answered is not None:
                try:
                    waiting.answered(waiting.result, error)
                except Exception:
                    log.exception("handling a limiter answer failed")
        with self._lock:
            self._in_flight -= 1
            following = self._take_locked()
            if self._closing:
                self._held.notify_all()  # close() waits for the last Batch on the wire
        if following:
            self._send(following)


class LimiterClient:
    """Thread-safe; one per process. ``close()`` when done."""

    def __init__(
        self,
        address: str,
        *,
        deadline_ms: int = LimiterSettings.deadline_ms,
        settle_deadline_ms: int = 1_000,
        emergency: EmergencyQuota | None = None,
        default_lease_ms: int = 60_000,
        unavailable_retry_ms: int = 1_000,
        token: str | None = None,
        credentials: Any = None,
        batching: bool = True,
    ) -> None:
        """``token`` goes with every LimiterService call; ``credentials`` (``grpc.ChannelCredentials``)
        make the channel TLS, plaintext when None. ``batching=False``: one RPC per Acquire and per
        Release (as against a limiter without ``Batch``)."""
        if credentials is None:
            self._channel = grpc.insecure_channel(address, options=_CHANNEL_OPTIONS)
        else:
            self._channel = grpc.secure_channel(address, credentials, options=_CHANNEL_OPTIONS)
        self._metadata = bearer_metadata(token)
        self._stub = pb_grpc.LimiterServiceStub(self._channel)
        self._batcher = _Batcher(self._stub, self._metadata, _BATCH_LANES, _BATCH_MAX_ITEMS)
        self._batching = batching
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._health_lock = threading.Lock()
        self._health_at = float("-inf")
        self._health_answer: str | None = None
        self._deadline_s = deadline_ms / 1000
        self._settle_deadline_s = settle_deadline_ms / 1000
        self._emergency = emergency
        self._default_lease_ms = default_lease_ms
        self._unavailable_retry_ms = unavailable_retry_ms
        # Acquires that timed out may still have been granted; released NOT_SENT once reachable.
        self._orphans: deque[str] = deque(maxlen=_MAX_ORPHANS)
        self._orphans_lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: LimiterSettings | None = None) -> LimiterClient:
        settings = settings or LimiterSettings.from_env()
        emergency = None
        if settings.emergency_share > 0:
            # The pool sizes come from the same file the limiter reads, so the quota is known even
            # when the limiter never answered.
            emergency = EmergencyQuota.from_config(
                load_config(settings.config_path),
                settings.emergency_share,
                retry_ms=settings.unavailable_retry_ms,
            )
        return cls(
            settings.address,
            deadline_ms=settings.deadline_ms,
            settle_deadline_ms=settings.settle_deadline_ms,
            emergency=emergency,
            default_lease_ms=settings.default_lease_ms,
            unavailable_retry_ms=settings.unavailable_retry_ms,
            token=settings.token,
            credentials=channel_credentials(settings),
        )

    def close(self) -> None:
        self._batcher.close(self._settle_deadline_s)  # the held Releases first
        self._channel.close()

    def readiness(self) -> str | None:
        """None when the limiter answers SERVING (it has Redis), else why not; remembered for 2 s."""
        with self._health_lock:
            if time.monotonic() - self._health_at < 2.0:
                return self._health_answer
            try:
                response = self._health.Check(
                    health_pb2.HealthCheckRequest(service="fatura.limiter.v1.LimiterService"), timeout=1.0
                )
                serving = response.status == health_pb2.HealthCheckResponse.SERVING
                answer = None if serving else "limiter: NOT_SERVING (its Redis does not answer)"
            except grpc.RpcError as exc:
                answer = f"limiter: {exc.code().name}"
            self._health_at, self._health_answer = time.monotonic(), answer
            return answer

    def __enter__(self) -> LimiterClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _traced(self) -> tuple[tuple[str, str], ...] | None:
        """The call's metadata, with the current span's traceparent when there is one, so the
        limiter's span joins the job's trace (services/common/tracing.py)."""
        traceparent = tracing.current_traceparent()
        if traceparent is None:
            return self._metadata
        return (*(self._metadata or ()), (tracing.TRACEPARENT, traceparent))

    def acquire(
        self,
        pool: str,
        tenant: str,
        estimated_input_tokens: int,
        max_output_tokens: int,
        *,
        lease_ms: int = 0,
        request_key: str | None = None,
    ) -> Grant | Denial:
        """A permit, or a Denial saying why and when to try again. Raises ``InvalidArgument`` for a
        bad request, ``NeverAdmittable`` for one no wait could grant (bigger than the pool's TPM or
        a local pool's whole KV cache) and ``LimiterUnauthenticated`` for a refused token; never
        raises because the limiter is unreachable (a Denial with reason UNAVAILABLE, or an
        emergency Grant)."""
        key = request_key or uuid.uuid4().hex
        if request_key is not None and self._orphans:
            self._forget_orphan(permit_id_for(pool, tenant, key))  # the caller is retrying it
        # Filled in place: a request built apart would be copied again into its BatchItem.
        item = pb.BatchItem()
        request = item.acquire
        request.pool = pool
        request.tenant = tenant
        request.estimated_input_tokens = estimated_input_tokens
        request.max_output_tokens = max_output_tokens
        request.lease_ms = lease_ms
        request.request_key = key
        try:
            response = self._exchange("Acquire", item, self._deadline_s, traced=True)
        except _Failed as exc:
            error = self._translate("Acquire", exc.code, exc.details)
            if not isinstance(error, LimiterUnavailable):
                raise error from exc
            if exc.code == grpc.StatusCode.DEADLINE_EXCEEDED and exc.sent:
                self._remember_orphan(pool, tenant, key)
            return self._emergency_acquire(pool, estimated_input_tokens + max_output_tokens, lease_ms, error)
        self._settle_orphans()
        if response.WhichOneof("result") == "granted":
            granted = response.granted
            return Grant(permit_id=granted.permit_id, lease_expires_at_ms=_ms(granted.lease_expires_at))
        denied = response.denied
        reason = DenyReason(pb.DenyReason.Name(denied.reason).removeprefix("DENY_REASON_"))
        return Denial(reason=reason, retry_after_ms=denied.retry_after_ms)

    def _emergency_acquire(
        self, pool: str, tokens: int, lease_ms: int, error: LimiterError
    ) -> Grant | Denial:
        if self._emergency is None:
            EMERGENCY.labels(pool, "closed").inc()
            log.warning(
                "limiter unreachable (%s); emergency quota closed, acquire on pool %s denied", error, pool
            )
            return Denial(DenyReason.UNAVAILABLE, self._unavailable_retry_ms)
        result = self._emergency.try_acquire(pool, tokens, lease_ms or self._default_lease_ms)
        limits = self._emergency.limits(pool)
        if isinstance(result, Grant):
            EMERGENCY.labels(pool, "granted").inc()
            log.warning(
                "limiter unreachable (%s); EMERGENCY permit %s on pool %s (%d of %s local slots in use)",
                error,
                result.permit_id,
                pool,
                self._emergency.held(pool),
                limits.max_in_flight if limits else 0,
            )
        else:
            EMERGENCY.labels(pool, "exhausted").inc()
            log.warning(
                "limiter unreachable (%s); emergency quota for pool %s exhausted, retry in %d ms",
                error,
                pool,
                result.retry_after_ms,
            )
        return result

    def _remember_orphan(self, pool: str, tenant: str, key: str) -> None:
        with self._orphans_lock:
            self._orphans.append(permit_id_for(pool, tenant, key))

    def _forget_orphan(self, permit_id: str) -> None:
        with self._orphans_lock:
            if permit_id in self._orphans:
                self._orphans.remove(permit_id)

    def _settle_orphans(self, limit: int = 8) -> None:
        """Release (NOT_SENT) permits whose Acquire timed out: the caller never used them."""
        if not self._orphans:  # the usual case, read without the lock
            return
        for _ in range(limit):
            with self._orphans_lock:
                if not self._orphans:
                    return
                permit_id = self._orphans.popleft()
            try:
                # A caller that retried the same request_key may hold it now: it settles it.
                self.release(permit_id, Outcome.NOT_SENT, unless_handed_again=True)
            except PermitNotFound:
                pass  # the timed-out Acquire never reached Redis
            except LimiterError as exc:
                log.info("could not settle timed-out acquire %s yet: %s", permit_id, exc)
                with self._orphans_lock:
                    self._orphans.append(permit_id)
                return

    def renew(self, permit_id: str, lease_ms: int = 0) -> int:
        """Extend the lease; returns the new expiry (Unix ms). Raises ``PermitNotHeld`` when the lease
        is lost, ``LimiterUnavailable`` when the limiter cannot be reached."""
        if is_emergency(permit_id):
            expires = (
                None
                if self._emergency is None
                else self._emergency.renew(permit_id, lease_ms or self._default_lease_ms)
            )
            if expires is None:
                raise PermitNotHeld(f"emergency permit {permit_id!r} is no longer held")
            return expires
        response = self._call("Renew", pb.RenewRequest(permit_id=permit_id, lease_ms=lease_ms))
        return _ms(response.lease_expires_at)

    def release(
        self,
        permit_id: str,
        outcome: Outcome,
        input_tokens: int = 0,
        output_tokens: int = 0,
        *,
        unless_handed_again: bool = False,
    ) -> bool:
        """Settle the permit; True if this call settled it, False if it already was (or, with
        ``unless_handed_again``, if a retried Acquire handed it to a caller that settles it itself).
        Emergency permits are settled locally and never sent to the limiter."""
        if is_emergency(permit_id):
            return self._emergency is not None and self._emergency.release(
                permit_id, outcome, input_tokens + output_tokens
            )
        item = _release_item(permit_id, outcome, input_tokens, output_tokens)
        item.release.unless_handed_again = unless_handed_again
        try:
            response = self._exchange("Release", item, self._settle_deadline_s, traced=False)
        except _Failed as exc:
            raise self._translate("Release", exc.code, exc.details) from exc
        return not response.already_released

    def release_later(
        self, permit_id: str, outcome: Outcome, input_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        """``release`` without waiting for the limiter: the Release travels with this process's
        next call (or alone after a few milliseconds). A failure is logged; the permit's lease
        expires on its own, as after any Release that could not be made."""
        if is_emergency(permit_id) or not self._batching:
            try:
                self.release(permit_id, outcome, input_tokens, output_tokens)
            except LimiterError as exc:
                log.warning("could not release permit %s (%s): %s", permit_id, outcome.value, exc)
            return
        item = _release_item(permit_id, outcome, input_tokens, output_tokens)

        def answered(result: pb.BatchResult | None, failed: _Failed | None) -> None:
            if failed is None and result is not None and result.WhichOneof("result") == "error":
                code = _STATUS_BY_VALUE.get(result.error.code, grpc.StatusCode.UNKNOWN)
                failed = _Failed(code, result.error.message)
            if failed is None:
                return
            if failed.code == grpc.StatusCode.UNIMPLEMENTED:
                # An older limiter: this Release is made on its own, and every call from now on.
                self._batching = False
                threading.Thread(
                    target=self.release_later,
                    args=(permit_id, outcome, input_tokens, output_tokens),
                    daemon=True,
                ).start()
                return
            error = self._translate("Release", failed.code, failed.details)
            log.warning("could not release permit %s (%s): %s", permit_id, outcome.value, error)

        self._batcher.post(item, self._settle_deadline_s, answered)

    def _exchange(self, method: str, item: pb.BatchItem, timeout_s: float, *, traced: bool) -> Any:
        """One Acquire or Release (the request in ``item``): inside a Batch while the limiter has
        that RPC, else its own RPC. Raises ``_Failed`` with the status the call got."""
        field = "acquire" if method == "Acquire" else "release"
        if self._batching:
            traceparent = tracing.current_traceparent() if traced else None
            if traceparent is not None:
                item.traceparent = traceparent
            try:
                result = self._batcher.call(item, timeout_s)
            except _Failed as exc:
                if exc.code != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                log.warning("the limiter has no Batch RPC (an older version): one RPC per call from now on")
                self._batching = False
            else:
                if result.WhichOneof("result") == "error":
                    code = _STATUS_BY_VALUE.get(result.error.code, grpc.StatusCode.UNKNOWN)
                    raise _Failed(code, result.error.message)
                return getattr(result, field)
        metadata = self._traced() if traced else self._metadata
        try:
            return getattr(self._stub, method)(getattr(item, field), timeout=timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            raise _Failed(exc.code(), exc.details() or exc.code().name) from exc

    def report_throttle(self, pool: str, retry_after_ms: int) -> int:
        """Start (or keep) the pool's cooldown; returns its end (Unix ms). The local emergency quota
        honours it too, even when the limiter cannot be told."""
        if self._emergency is not None:
            self._emergency.note_throttle(pool, retry_after_ms)
        response = self._call(
            "ReportThrottle", pb.ReportThrottleRequest(pool=pool, retry_after_ms=retry_after_ms)
        )
        return _ms(response.cooldown_until)

    def pool_status(self, pool: str) -> PoolStatus:
        return _pool_status(self._call("PoolStatus", pb.PoolStatusRequest(pool=pool)))

    def pool_statuses(self) -> list[PoolStatus]:
        """Every configured pool's status, ordered by name."""
        response = self._call("ListPoolStatus", pb.ListPoolStatusRequest())
        return [_pool_status(p) for p in response.pools]

    def _call(self, method: str, request: Any) -> Any:
        try:
            # Only Acquire is on a caller's critical path; the rest settle what is held already.
            stub_method = getattr(self._stub, method)
            return stub_method(request, timeout=self._settle_deadline_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            raise self._translate(method, exc.code(), exc.details() or exc.code().name) from exc

    def _translate(self, method: str, code: grpc.StatusCode, details: str) -> LimiterError:
        """The typed error of a failed call, counted; a refused token is logged where it happens."""
        error = ERROR_BY_STATUS.get(code, BackendError)(f"{code.name}: {details}")
        if isinstance(error, LimiterUnavailable):
            UNREACHABLE.labels(method).inc()
        elif isinstance(error, LimiterUnauthenticated):
            UNAUTHENTICATED.labels(method).inc()
            log.error(
                "limiter refused %s as UNAUTHENTICATED (%s): FATURA_LIMITER_TOKEN is wrong or missing; "
                "a configuration error, not an outage",
                method,
                error,
            )
        return error


def _release_item(permit_id: str, outcome: Outcome, input_tokens: int, output_tokens: int) -> pb.BatchItem:
    item = pb.BatchItem()
    request = item.release
    request.permit_id = permit_id
    request.outcome = _OUTCOME_VALUE[outcome]
    request.input_tokens = input_tokens
    request.output_tokens = output_tokens
    return item


def _pool_status(response: Any) -> PoolStatus:
    return PoolStatus(
        pool=response.pool,
        window_ms=response.window_ms,
        requests=Dimension(response.requests.limit, response.requests.used),
        tokens=Dimension(response.tokens.limit, response.tokens.used),
        in_flight=Dimension(response.in_flight.limit, response.in_flight.used),
        cooldown_until_ms=_ms(response.cooldown_until) if response.HasField("cooldown_until") else None,
        observed_at_ms=_ms(response.observed_at),
    )
