"""The HTTP edge (DESIGN §6) on Starlette.

Routes are thin: they parse, call one service function, and map errors to status codes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.acceptance import metrics, openapi
from services.acceptance.accept import Acceptor
from services.acceptance.auth import Authenticator, Principal
from services.acceptance.documents import store_document
from services.acceptance.errors import ApiError, Unavailable
from services.acceptance.idempotency import validate_key
from services.acceptance.jobs import JobService
from services.acceptance.ops import ops_routes
from services.acceptance.queries import Q
from services.acceptance.requests import RequestParser
from services.acceptance.schemas import MAX_LIST_LIMIT
from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import Tenant
from services.common import states
from services.common.db import async_pool
from services.common.ids import parse_uuid
from services.common.uow import OutboxNotifier
from services.delivery.api import delivery_routes
from services.delivery.endpoints import Endpoints
from services.delivery.settings import DeliverySettings

log = logging.getLogger(__name__)


class Edge:
    """Everything the routes share, built once per worker process."""

    def __init__(self, settings: AcceptanceSettings) -> None:
        self.settings = settings
        # Autocommit: a single read or a single-statement write is one round trip; a multi-statement
        # unit of work still opens its own transaction.
        self.pool = async_pool(settings.common, name="http", autocommit=True, role="edge")
        self.notifier = OutboxNotifier(self.pool)
        self.auth = Authenticator(self.pool, settings.auth_cache_seconds)
        self.parser = RequestParser(settings)
        self.jobs = JobService(self.pool, self.notifier)
        self.acceptor = Acceptor(self.pool, self.notifier, settings)
        self.openapi = openapi.build(settings)
        # Webhook endpoints and deliveries (services/delivery) share this edge's auth, pool and errors.
        self.endpoints = Endpoints(self.pool, DeliverySettings.from_env())

    async def tenant(self, request: Request) -> Tenant:
        return await self.auth.authenticate(request.headers.get("authorization"))

    async def operator(self, request: Request) -> Principal:
        return await self.auth.operator(request.headers.get("authorization"))

    async def json_body(self, request: Request) -> Any:
        self.parser.check_content_type(request.headers.get("content-type"))
        self.parser.check_declared_length(request.headers.get("content-length"))
        chunks: list[bytes] = []
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            self.parser.check_streamed_length(received)
            chunks.append(chunk)
        return self.parser.parse_json(b"".join(chunks))


def _only_query(request: Request, *allowed: str) -> None:
    unknown = sorted(set(request.query_params.keys()) - set(allowed))
    if unknown:
        accepted = f"; this route accepts {', '.join(allowed)}" if allowed else "; this route takes none"
        raise ApiError(f"unknown query parameters {unknown}{accepted}", code="invalid_query")


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(body, status_code=status, headers=headers)


def build_routes(edge: Edge) -> list[BaseRoute]:
    async def create_document(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        parsed = edge.parser.create_document(await edge.json_body(request))
        return _json(await store_document(edge.pool, tenant, parsed), 201)

    async def create_job(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        body = await edge.json_body(request)
        key = validate_key(request.headers.get("idempotency-key"))
        accepted = await edge.acceptor.accept(tenant, key, edge.parser.create_job(body))
        headers = {"Location": accepted.body["status_url"]}
        if accepted.replay:
            headers["Idempotent-Replayed"] = "true"
        return _json(accepted.body, 202, headers)

    async def list_jobs(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request, "state", "cursor", "limit")
        q = request.query_params
        state = q.get("state")
        if state is not None and state not in states.ALL:
            raise ApiError(f"state must be one of {sorted(states.ALL)}", code="invalid_query")
        raw_limit = q.get("limit", "50")
        if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise ApiError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", code="invalid_query")
        cursor = q.get("cursor")
        if cursor is not None and len(cursor) > 512:
            raise ApiError("the cursor is not one this server issued", code="invalid_cursor")
        return _json(await edge.jobs.list(tenant, state=state, cursor=cursor, limit=int(raw_limit)))

    async def get_job(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        return _json(await edge.jobs.get(tenant, parse_uuid(request.path_params["job_id"])))

    async def cancel_job(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        return _json(await edge.jobs.cancel(tenant, parse_uuid(request.path_params["job_id"])))

    async def openapi_json(request: Request) -> Response:
        return _json(edge.openapi)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    async def readyz(request: Request) -> Response:
        try:
            async with edge.pool.connection(timeout=2.0) as conn:
                await conn.execute(Q["ping"])
        except (psycopg.Error, PoolTimeout) as exc:
            return PlainTextResponse(f"not ready: database: {type(exc).__name__}\n", status_code=503)
        return PlainTextResponse("ready\n")

    return [
        Route("/v1/documents", create_document, methods=["POST"], name="create_document"),
        Route("/v1/extraction-jobs", create_job, methods=["POST"], name="create_job"),
        Route("/v1/extraction-jobs", list_jobs, methods=["GET"], name="list_jobs"),
        Route("/v1/extraction-jobs/{job_id}:cancel", cancel_job, methods=["POST"], name="cancel_job"),
        Route("/v1/extraction-jobs/{job_id}", get_job, methods=["GET"], name="get_job"),
        Route("/openapi.json", openapi_json, methods=["GET"], name="openapi"),
        Route("/healthz", healthz, methods=["GET"], name="healthz"),
        Route("/readyz", readyz, methods=["GET"], name="readyz"),
        *delivery_routes(edge, edge.endpoints),
        *ops_routes(edge, edge.pool, edge.settings.common.queue_prefix),
    ]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _json(exc.body(), exc.status, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    body = {"error": {"code": code, "message": str(exc.detail)}}
    return _json(body, exc.status_code, dict(exc.headers or {}))


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    log.error("database unavailable: %s: %s", type(exc).__name__, exc)
    err = Unavailable(
        "the database is not answering; nothing was changed. Retry after 5 seconds.",
        code="database_unavailable",
        headers={"Retry-After": "5"},
    )
    return _json(err.body(), err.status, err.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    body = {"error": {"code": "internal_error", "message": "an unexpected error occurred on the server"}}
    return _json(body, 500)


class MetricsMiddleware:
    """Counts and times every request by its route template (never by raw path: ids are unbounded)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = scope.get("route")
            name = getattr(route, "name", None) or "unmatched"
            method = scope.get("method", "")
            metrics.REQUESTS.labels(method, name, str(status)).inc()
            metrics.LATENCY.labels(method, name).observe(time.perf_counter() - started)


def create_app(settings: AcceptanceSettings) -> Starlette:
    edge = Edge(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await edge.pool.open(wait=False)
        try:
            yield
        finally:
            await edge.pool.close()

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        psycopg.OperationalError: _database_unavailable,
        PoolTimeout: _database_unavailable,
        Exception: _internal_error,
    }
    app = Starlette(routes=build_routes(edge), lifespan=lifespan, exception_handlers=handlers)
    app.add_middleware(MetricsMiddleware)
    app.state.edge = edge
    return app


def create_app_from_env() -> Starlette:
    """The factory uvicorn calls in each worker process."""
    return create_app(AcceptanceSettings.from_env())
