"""gRPC LimiterService (grpc.aio): parse the protobuf request, run one operation, map errors to
status codes. Nothing else happens here."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from typing import Any, TypeVar

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from services.common import tracing
from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.limiter import metrics
from services.limiter.errors import (
    BackendError,
    BackendUnavailable,
    InvalidArgument,
    LimiterError,
    LimiterUnauthenticated,
    LimiterUnavailable,
    NeverAdmittable,
    PermitNotFound,
    PermitNotHeld,
    RequestKeyConflict,
    UnknownPool,
)
from services.limiter.model import (
    AcquireRequest,
    Denial,
    DenyReason,
    Dimension,
    Grant,
    Outcome,
    PoolStatus,
)
from services.limiter.operations import LimiterOps, Operation, Released
from services.limiter.store import AsyncRedisStore

log = logging.getLogger(__name__)
R = TypeVar("R")
# Items in one Batch call; the store pipelines up to 256 script calls in one round trip.
MAX_BATCH_ITEMS = 256

STATUS_BY_ERROR: dict[type[LimiterError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    UnknownPool: grpc.StatusCode.INVALID_ARGUMENT,
    # Its own code, so a client can tell "never, whatever you wait" from a malformed request.
    NeverAdmittable: grpc.StatusCode.OUT_OF_RANGE,
    PermitNotFound: grpc.StatusCode.NOT_FOUND,
    PermitNotHeld: grpc.StatusCode.FAILED_PRECONDITION,
    RequestKeyConflict: grpc.StatusCode.ALREADY_EXISTS,
    BackendUnavailable: grpc.StatusCode.UNAVAILABLE,
    BackendError: grpc.StatusCode.INTERNAL,
    LimiterUnavailable: grpc.StatusCode.UNAVAILABLE,
    # Raised by no operation: the token interceptor answers it before the servicer runs.
    LimiterUnauthenticated: grpc.StatusCode.UNAUTHENTICATED,
}
_REASON_TO_PROTO = {
    reason: pb.DenyReason.Value(f"DENY_REASON_{reason.value}")
    for reason in DenyReason
    if reason.value != "UNAVAILABLE"
}
_OUTCOME_FROM_PROTO: dict[int, Outcome] = {
    pb.Outcome.Value(f"OUTCOME_{outcome.value}"): outcome for outcome in Outcome
}


def status_for(error: LimiterError) -> grpc.StatusCode:
    for cls in type(error).__mro__:
        if cls in STATUS_BY_ERROR:
            return STATUS_BY_ERROR[cls]
    return grpc.StatusCode.INTERNAL


def timestamp(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def outcome_from_proto(value: int) -> Outcome:
    try:
        return _OUTCOME_FROM_PROTO[value]
    except KeyError:
        raise InvalidArgument("outcome must be COMPLETED, NOT_SENT or UNKNOWN") from None


def _pool_of(permit_id: str) -> str:
    """The pool of a permit that a Release settled: its id was parsed when the Release was built."""
    return permit_id.partition("/")[0]


class LimiterServicer(pb_grpc.LimiterServiceServicer):
    def __init__(self, ops: LimiterOps, store: AsyncRedisStore) -> None:
        self._ops = ops
        self._store = store

    async def _handle(self, method: str, context: Any, call: Callable[[], Awaitable[R]]) -> R:
        if not tracing.enabled():
            return await self._measured(method, context, call)
        incoming = None
        for key, value in context.invocation_metadata() or ():
            if key == tracing.TRACEPARENT:
                incoming = tracing.valid(value)
        with tracing.span(f"LimiterService/{method}", incoming, kind=tracing.SpanKind.SERVER):
            return await self._measured(method, context, call)

    async def _measured(self, method: str, context: Any, call: Callable[[], Awaitable[R]]) -> R:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            return await call()
        except LimiterError as exc:
            code = status_for(exc)
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
                log.warning("%s failed: %s", method, exc)
            await context.abort(code, str(exc))
            raise AssertionError("context.abort returned") from exc  # abort always raises
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED  # the caller gave up (deadline) or the server stops
            raise
        except Exception:
            code = grpc.StatusCode.UNKNOWN  # a bug: grpc answers UNKNOWN and logs the traceback
            raise
        finally:
            metrics.labelled(metrics.RPC_SECONDS, method, code.name).observe(time.perf_counter() - started)

    async def Acquire(self, request: pb.AcquireRequest, context: Any) -> pb.AcquireResponse:
        async def call() -> pb.AcquireResponse:
            result = await self._store.execute(self._ops.acquire(_acquire_request(request)))
            return _acquire_response(request.pool, result)

        return await self._handle("Acquire", context, call)

    async def Renew(self, request: pb.RenewRequest, context: Any) -> pb.RenewResponse:
        async def call() -> pb.RenewResponse:
            expires = await self._store.execute(self._ops.renew(request.permit_id, request.lease_ms))
            return pb.RenewResponse(lease_expires_at=timestamp(expires))

        return await self._handle("Renew", context, call)

    async def Release(self, request: pb.ReleaseRequest, context: Any) -> pb.ReleaseResponse:
        async def call() -> pb.ReleaseResponse:
            outcome = outcome_from_proto(request.outcome)
            op = self._ops.release(
                request.permit_id,
                outcome,
                request.input_tokens,
                request.output_tokens,
                unless_handed_again=request.unless_handed_again,
            )
            return _release_response(request, outcome, await self._store.execute(op))

        return await self._handle("Release", context, call)

    async def ReportThrottle(
        self, request: pb.ReportThrottleRequest, context: Any
    ) -> pb.ReportThrottleResponse:
        async def call() -> pb.ReportThrottleResponse:
            throttled = await self._store.execute(
                self._ops.report_throttle(request.pool, request.retry_after_ms)
            )
            metrics.THROTTLE_REPORTS.labels(request.pool, "true" if throttled.extended else "false").inc()
            return pb.ReportThrottleResponse(cooldown_until=timestamp(throttled.cooldown_until_ms))

        return await self._handle("ReportThrottle", context, call)

    async def PoolStatus(self, request: pb.PoolStatusRequest, context: Any) -> pb.PoolStatusResponse:
        async def call() -> pb.PoolStatusResponse:
            return _status_message(await self._store.execute(self._ops.pool_status(request.pool)))

        return await self._handle("PoolStatus", context, call)

    async def ListPoolStatus(
        self, request: pb.ListPoolStatusRequest, context: Any
    ) -> pb.ListPoolStatusResponse:
        async def call() -> pb.ListPoolStatusResponse:
            names = sorted(self._ops.config.pools)
            statuses = [await self._store.execute(self._ops.pool_status(name)) for name in names]
            return pb.ListPoolStatusResponse(pools=[_status_message(s) for s in statuses])

        return await self._handle("ListPoolStatus", context, call)

    async def Batch(self, request: pb.BatchRequest, context: Any) -> pb.BatchResponse:
        async def call() -> pb.BatchResponse:
            started = time.perf_counter()
            items = request.items
            if len(items) > MAX_BATCH_ITEMS:
                raise InvalidArgument(f"a batch holds at most {MAX_BATCH_ITEMS} items, not {len(items)}")
            ops = [self._item_operation(item) for item in items]
            if not tracing.enabled():
                results = await self._store.execute_all(ops)
            else:
                with ExitStack() as spans:
                    # A span in each caller's trace; an item without one joins no other item's trace.
                    for item in items:
                        incoming = tracing.valid(item.traceparent) if item.traceparent else None
                        if incoming is None:
                            continue
                        name = f"LimiterService/{(item.WhichOneof('call') or 'none').capitalize()}"
                        kind = tracing.SpanKind.SERVER
                        spans.enter_context(tracing.span(name, incoming, {"batch": len(items)}, kind=kind))
                    results = await self._store.execute_all(ops)
            seconds = time.perf_counter() - started
            response = pb.BatchResponse()
            add = response.results.add  # built in place: a message given to a constructor is copied
            for item, result in zip(items, results, strict=True):
                _item_result(add(), item, result, seconds)
            return response

        return await self._handle("Batch", context, call)

    def _item_operation(self, item: pb.BatchItem) -> Operation[Any] | LimiterError:
        """The item's operation, or why its own RPC would have been refused."""
        try:
            kind = item.WhichOneof("call")
            if kind == "acquire":
                return self._ops.acquire(_acquire_request(item.acquire))
            if kind == "release":
                r = item.release
                outcome = outcome_from_proto(r.outcome)
                return self._ops.release(
                    r.permit_id,
                    outcome,
                    r.input_tokens,
                    r.output_tokens,
                    unless_handed_again=r.unless_handed_again,
                )
            raise InvalidArgument("a batch item must hold an acquire or a release")
        except LimiterError as exc:
            return exc


def _acquire_request(request: pb.AcquireRequest) -> AcquireRequest:
    return AcquireRequest(
        pool=request.pool,
        tenant=request.tenant,
        estimated_input_tokens=request.estimated_input_tokens,
        max_output_tokens=request.max_output_tokens,
        lease_ms=request.lease_ms,
        request_key=request.request_key,
    )


def _acquire_response(pool: str, result: Grant | Denial) -> pb.AcquireResponse:
    response = pb.AcquireResponse()
    _fill_acquire(response, pool, result)
    return response


def _fill_acquire(response: pb.AcquireResponse, pool: str, result: Grant | Denial) -> None:
    if isinstance(result, Denial):
        metrics.labelled(metrics.DENIALS, pool, result.reason.value).inc()
        denied = response.denied
        denied.SetInParent()
        denied.reason = _REASON_TO_PROTO[result.reason]
        denied.retry_after_ms = result.retry_after_ms
        return
    metrics.labelled(metrics.GRANTS, pool).inc()
    granted = response.granted
    granted.SetInParent()
    granted.permit_id = result.permit_id
    ms = result.lease_expires_at_ms
    expires = granted.lease_expires_at
    expires.seconds, expires.nanos = ms // 1000, (ms % 1000) * 1_000_000  # as timestamp() builds it


def _release_response(request: pb.ReleaseRequest, outcome: Outcome, released: Released) -> pb.ReleaseResponse:
    response = pb.ReleaseResponse()
    _fill_release(response, request.permit_id, outcome, released)
    return response


def _fill_release(response: pb.ReleaseResponse, permit_id: str, outcome: Outcome, released: Released) -> None:
    if not released.already_released:
        metrics.labelled(metrics.RELEASES, _pool_of(permit_id), outcome.value).inc()
    response.SetInParent()
    response.already_released = released.already_released


# The method an item of a Batch is counted under: its own RPC's.
_ITEM_METHOD = {"acquire": "Acquire", "release": "Release"}


def _item_result(out: pb.BatchResult, item: pb.BatchItem, result: Any, seconds: float) -> None:
    """One item's answer, written into ``out``: what its own RPC would have answered, counted as
    that RPC would be (with the time its Batch took)."""
    kind = item.WhichOneof("call")
    method = _ITEM_METHOD.get(kind or "", "Batch")
    if isinstance(result, LimiterError):
        code = status_for(result)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL):
            log.warning("%s (in a batch) failed: %s", method, result)
        metrics.labelled(metrics.RPC_SECONDS, method, code.name).observe(seconds)
        error = out.error
        error.code = code.value[0]
        error.message = str(result)
        return
    metrics.labelled(metrics.RPC_SECONDS, method, "OK").observe(seconds)
    if kind == "acquire":
        _fill_acquire(out.acquire, item.acquire.pool, result)
        return
    release = item.release
    _fill_release(out.release, release.permit_id, outcome_from_proto(release.outcome), result)


def _status_message(status: PoolStatus) -> pb.PoolStatusResponse:
    def dimension(d: Dimension) -> pb.Dimension:
        return pb.Dimension(limit=d.limit, used=d.used, headroom=d.headroom)

    response = pb.PoolStatusResponse(
        pool=status.pool,
        window_ms=status.window_ms,
        requests=dimension(status.requests),
        tokens=dimension(status.tokens),
        in_flight=dimension(status.in_flight),
        observed_at=timestamp(status.observed_at_ms),
    )
    if status.cooldown_until_ms is not None:
        response.cooldown_until.CopyFrom(timestamp(status.cooldown_until_ms))
    return response
