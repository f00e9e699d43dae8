"""The HTTP edge (DESIGN §6) on Starlette: one public door that mounts each service's routes.

The edge composes; it owns no business. Acceptance (documents, jobs) and delivery (webhook
endpoints, deliveries) each hand it their routes, built on the ``ApiContext`` (pool, keys, body
reader) the edge makes once per worker; operator routes and the OpenAPI document sit beside them.
Errors of every route map to one JSON shape here.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.acceptance.http_api import (
    AcceptanceSettings,
    EventFeed,
    EventSettings,
    acceptance_routes,
    end_streams_on_exit,
    event_routes,
)
from services.common import logs, readiness, tracing
from services.common.api.auth import Authenticator
from services.common.api.body import JsonBody
from services.common.api.context import ApiContext, json_response
from services.common.api.errors import ApiError, Unavailable
from services.common.api.keywatch import KeyWatch
from services.common.api.throttle import FailureThrottle
from services.common.db import async_pool
from services.delivery.http_api import DeliverySettings, Endpoints, delivery_routes
from services.edge import metrics, openapi
from services.edge.ops import ops_routes
from services.edge.review_page import review_page_routes
from services.edge.tracing import TraceMiddleware
from services.inference.http_api import review_routes

log = logging.getLogger(__name__)


class Edge:
    """Everything the routes share, built once per worker process."""

    def __init__(self, settings: AcceptanceSettings) -> None:
        self.settings = settings
        # Autocommit: a single read or a single-statement write is one round trip; a multi-statement
        # unit of work still opens its own transaction.
        self.pool = async_pool(
            settings.common, name="http", autocommit=True, role="edge", db_role="fatura_edge"
        )
        throttle = FailureThrottle(settings.auth_failure_limit, 60.0, settings.auth_block_seconds)
        auth = Authenticator(self.pool, settings.auth_cache_seconds, throttle)
        self.context = ApiContext(self.pool, auth, JsonBody(settings.max_body_bytes))
        self.openapi = openapi.build(settings)
        self.endpoints = Endpoints(self.pool, DeliverySettings.from_env())
        self.events = EventSettings.from_env()
        self.feed = EventFeed(settings.common, self.events, self.pool, name="http", db_role="fatura_edge")
        self.keys = KeyWatch(self.pool, self.events.auth_recheck_seconds)


def build_routes(edge: Edge) -> list[BaseRoute]:
    async def openapi_json(request: Request) -> Response:
        return json_response(edge.openapi)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    database = readiness.postgres_async(edge.pool)

    async def readyz(request: Request) -> Response:
        status, text = await readiness.verdict_async(database)
        return PlainTextResponse(text, status_code=status)

    return [
        *acceptance_routes(edge.context, edge.settings),
        *event_routes(edge.context, edge.feed, edge.keys, edge.events),
        *review_routes(edge.context, dict(os.environ)),
        *delivery_routes(edge.context, edge.endpoints),
        *ops_routes(edge.context, edge.settings.common.queue_prefix),
        *review_page_routes(),
        Route("/openapi.json", openapi_json, methods=["GET"], name="openapi"),
        Route("/healthz", healthz, methods=["GET"], name="healthz"),
        Route("/readyz", readyz, methods=["GET"], name="readyz"),
    ]


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return json_response(exc.body(), exc.status, exc.headers)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "route_not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
    body = {"error": {"code": code, "message": str(exc.detail)}}
    return json_response(body, exc.status_code, dict(exc.headers or {}))


async def _database_unavailable(request: Request, exc: Exception) -> Response:
    log.error("database unavailable: %s: %s", type(exc).__name__, exc)
    err = Unavailable(
        "the database is not answering; nothing was changed. Retry after 5 seconds.",
        code="database_unavailable",
        headers={"Retry-After": "5"},
    )
    return json_response(err.body(), err.status, err.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    body = {"error": {"code": "internal_error", "message": "an unexpected error occurred on the server"}}
    return json_response(body, 500)


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
        await edge.feed.start()
        await edge.keys.start()
        end_streams_on_exit(edge.feed)
        try:
            yield
        finally:
            await edge.keys.stop()
            await edge.feed.stop()
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
    app.add_middleware(TraceMiddleware)
    app.state.edge = edge
    return app


def create_app_from_env() -> Starlette:
    """The factory uvicorn calls in each worker process."""
    settings = AcceptanceSettings.from_env()
    # A worker started by uvicorn's supervisor is a fresh interpreter: set it up like its parent.
    if not logging.getLogger().handlers:
        logs.setup(settings.common.log_level, settings.common.log_format)
    tracing.setup("http", trace_file=settings.common.trace_file)
    return create_app(settings)
