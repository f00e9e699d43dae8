"""The HTTP edge (DESIGN §6) on Starlette: one public door for the routes the services hand it.

The edge composes; it owns no business and imports no service. The process that runs it
(``services/cli/http_edge.py``) builds each service's routes on the ``ApiContext`` (pool, keys, body
reader) made once per worker, and hands them in with the OpenAPI document; the edge adds its own
operator routes, the reviewer page and health, and maps the errors of every route to one JSON shape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import readiness
from services.common.api.context import ApiContext, json_response
from services.common.api.errors import ApiError, Unavailable
from services.common.api.openapi import JSON
from services.common.db import AsyncPool
from services.common.metric_children import Children
from services.edge import metrics
from services.edge.ops import ops_routes
from services.edge.review_page import review_page_routes
from services.edge.tracing import TraceMiddleware

log = logging.getLogger(__name__)


def edge_routes(context: ApiContext, pool: AsyncPool, queue_prefix: str, document: JSON) -> list[BaseRoute]:
    """The edge's own routes: operator views, the reviewer page, the OpenAPI document and health."""

    async def openapi_json(request: Request) -> Response:
        return json_response(document)

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    database = readiness.postgres_async(pool)

    async def readyz(request: Request) -> Response:
        status, text = await readiness.verdict_async(database)
        return PlainTextResponse(text, status_code=status)

    return [
        *ops_routes(context, queue_prefix),
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
        self._requests = Children(metrics.REQUESTS)
        self._latency = Children(metrics.LATENCY)

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
            self._requests(method, name, str(status)).inc()
            self._latency(method, name).observe(time.perf_counter() - started)


def create_app(
    routes: list[BaseRoute], lifespan: Callable[[Starlette], AbstractAsyncContextManager[None]]
) -> Starlette:
    """The app: ``routes`` (the services' and the edge's), with the one error shape, metrics and
    traces for all of them; ``lifespan`` opens and closes what they share."""
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        ApiError: _api_error,
        HTTPException: _http_error,
        psycopg.OperationalError: _database_unavailable,
        PoolTimeout: _database_unavailable,
        Exception: _internal_error,
    }
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.add_middleware(MetricsMiddleware)
    app.add_middleware(TraceMiddleware)
    return app
