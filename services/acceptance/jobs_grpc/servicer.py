"""gRPC JobService (grpc.aio), a thin transport like the HTTP routes: authenticate the call's key,
turn the message into the request the HTTP route would have parsed, call the same acceptance code
(``Acceptor``, ``JobService``), and move the answer, or the typed error, into protobuf."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import nullcontext
from typing import Any, NoReturn, TypeVar

import grpc

from services.acceptance import requests
from services.acceptance.accept import Acceptor
from services.acceptance.batches import BatchParser, BatchService
from services.acceptance.batches import requests as batch_requests
from services.acceptance.idempotency import validate_key
from services.acceptance.jobs import JobService
from services.acceptance.jobs_grpc import messages, metrics, status
from services.acceptance.jobs_grpc.watch import Watcher
from services.acceptance.requests import RequestParser
from services.common import failures, tracing
from services.common.api.auth import Authenticator
from services.common.api.errors import ApiError, Unauthorized, Unavailable
from services.common.api.tenancy import Tenant
from services.common.ids import parse_uuid
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)
R = TypeVar("R")

AUTHORIZATION = "authorization"


def database_unavailable() -> Unavailable:
    """What the HTTP edge answers while PostgreSQL is away."""
    return Unavailable(
        "the database is not answering; nothing was changed. Retry after 5 seconds.",
        code="database_unavailable",
        headers={"Retry-After": "5"},
    )


def internal_error() -> ApiError:
    return ApiError("an unexpected error occurred on the server", status=500, code="internal_error")


def as_api_error(exc: Exception) -> ApiError:
    """The typed error a failed call answers with; anything unexpected is logged and answered as
    INTERNAL without its words (they may carry hosts, SQL or data)."""
    if isinstance(exc, ApiError):
        return exc
    if failures.is_transient(exc):  # the database away, a pool timeout, a lock or statement timeout
        log.error("database unavailable: %s: %s", type(exc).__name__, exc)
        return database_unavailable()
    log.error("unexpected error in a JobService call", exc_info=exc)
    return internal_error()


async def _refuse(method: str, context: Any, exc: Exception, started: float) -> NoReturn:
    """End the call with the status of ``exc`` (a typed error, or INTERNAL / UNAVAILABLE)."""
    answer = status.to_status(as_api_error(exc))
    metrics.RPC_SECONDS.labels(method, answer.code.name).observe(time.perf_counter() - started)
    await context.abort(answer.code, answer.details, answer.trailing_metadata)
    raise AssertionError("context.abort returned") from exc  # abort always raises


def authorization(context: Any) -> str | None:
    """The call's one ``authorization`` metadata value (None when absent)."""
    values = [value for key, value in (context.invocation_metadata() or ()) if key == AUTHORIZATION]
    if len(values) > 1:
        raise Unauthorized("send one 'authorization: Bearer <api key>' metadata entry, not several")
    return str(values[0]) if values else None


def _metadata(context: Any, key: str) -> str | None:
    """The call's first metadata value under ``key`` (None when absent)."""
    for name, value in context.invocation_metadata() or ():
        if name == key:
            return str(value)
    return None


def peer_host(peer: str | None) -> str | None:
    """The caller's address in a gRPC peer string (``ipv4:127.0.0.1:5000``, ``ipv6:[::1]:5000``)."""
    if not peer:
        return None
    kind, _, rest = peer.partition(":")
    if kind == "ipv4":
        return rest.rpartition(":")[0] or None
    if kind == "ipv6":
        return rest.rpartition(":")[0].strip("[]") or None
    return peer


class JobServicer(pb_grpc.JobServiceServicer):
    def __init__(
        self,
        auth: Authenticator,
        parser: RequestParser,
        acceptor: Acceptor,
        jobs: JobService,
        batch_parser: BatchParser,
        batches: BatchService,
        watcher: Watcher,
    ) -> None:
        self._auth = auth
        self._parser = parser
        self._acceptor = acceptor
        self._jobs = jobs
        self._batch_parser = batch_parser
        self._batches = batches
        self._watcher = watcher

    async def tenant(self, context: Any) -> Tenant:
        """The tenant of the call's tenant-scoped key (UNAUTHENTICATED / PERMISSION_DENIED)."""
        return await self._auth.authenticate(authorization(context), peer_host(context.peer()))

    async def _handle(self, method: str, context: Any, call: Callable[[], Awaitable[R]]) -> R:
        started = time.perf_counter()
        incoming = tracing.valid(_metadata(context, tracing.TRACEPARENT))
        # A job accepted inside the span records the caller's trace (services/common/tracing.py).
        traced = incoming is not None or tracing.enabled()
        with (
            tracing.span(f"JobService/{method}", incoming, kind=tracing.SpanKind.SERVER)
            if traced
            else nullcontext()
        ):
            try:
                result = await call()
            except Exception as exc:
                await _refuse(method, context, exc, started)
        metrics.RPC_SECONDS.labels(method, grpc.StatusCode.OK.name).observe(time.perf_counter() - started)
        return result

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        async def call() -> pb.SubmitResponse:
            tenant = await self.tenant(context)
            key = validate_key(request.idempotency_key or None)
            job = self._parser.create_job(messages.submit_body(request))
            accepted = await self._acceptor.accept(tenant, key, job)
            return messages.submit_response(accepted.body, replayed=accepted.replay)

        return await self._handle("Submit", context, call)

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.JobStatus:
        async def call() -> pb.JobStatus:
            tenant = await self.tenant(context)
            return messages.job_status(await self._jobs.get(tenant, parse_uuid(request.job_id)))

        return await self._handle("Get", context, call)

    async def List(self, request: pb.ListRequest, context: Any) -> pb.ListResponse:
        async def call() -> pb.ListResponse:
            tenant = await self.tenant(context)
            query = requests.list_jobs(
                messages.state_name(request.state),
                request.cursor or None,
                str(request.limit) if request.limit else None,
            )
            page = await self._jobs.list(tenant, state=query.state, cursor=query.cursor, limit=query.limit)
            return messages.job_list(page)

        return await self._handle("List", context, call)

    async def Cancel(self, request: pb.CancelRequest, context: Any) -> pb.JobStatus:
        async def call() -> pb.JobStatus:
            tenant = await self.tenant(context)
            return messages.job_status(await self._jobs.cancel(tenant, parse_uuid(request.job_id)))

        return await self._handle("Cancel", context, call)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: Any) -> pb.SubmitBatchResponse:
        async def call() -> pb.SubmitBatchResponse:
            tenant = await self.tenant(context)
            key = validate_key(request.idempotency_key or None)
            batch = self._batch_parser.create_batch(messages.submit_batch_body(request))
            accepted = await self._batches.submit(tenant, key, batch)
            return messages.batch_response(accepted.body, replayed=accepted.replay)

        return await self._handle("SubmitBatch", context, call)

    async def GetBatch(self, request: pb.GetBatchRequest, context: Any) -> pb.BatchStatus:
        async def call() -> pb.BatchStatus:
            tenant = await self.tenant(context)
            return messages.batch_status(await self._batches.get(tenant, parse_uuid(request.batch_id)))

        return await self._handle("GetBatch", context, call)

    async def ListBatchItems(
        self, request: pb.ListBatchItemsRequest, context: Any
    ) -> pb.ListBatchItemsResponse:
        async def call() -> pb.ListBatchItemsResponse:
            tenant = await self.tenant(context)
            query = batch_requests.list_items(
                request.state or None, request.cursor or None, str(request.limit) if request.limit else None
            )
            page = await self._batches.items(
                tenant,
                parse_uuid(request.batch_id),
                state=query.state,
                cursor=query.cursor,
                limit=query.limit,
            )
            return messages.batch_items(page)

        return await self._handle("ListBatchItems", context, call)

    async def Watch(  # type: ignore[override]  # yields WatchResponses already encoded
        self, request: pb.WatchRequest, context: Any
    ) -> AsyncIterator[bytes]:
        # Yields encoded WatchResponses (each job event encoded once for every stream of the process).
        # A stream the client leaves is cancelled; one the server ends raises after its end event.
        started = time.perf_counter()
        try:
            key = await self._auth.tenant_key(authorization(context), peer_host(context.peer()))
            async for event in self._watcher.stream(key, request):
                yield event
        except Exception as exc:
            await _refuse("Watch", context, exc, started)
