"""``fatura run http``: the HTTP edge on uvicorn with N worker processes and a metrics port, and what
it mounts. This module is where the services meet (DESIGN §1: no service imports another): it takes
each one's routes and OpenAPI part from that service's ``http_api`` module and hands them to the
edge (``services/edge``), which knows none of them.

With more than one worker, each worker writes its metrics to a shared directory and the parent
serves them merged (prometheus-client multiprocess mode) on ``FATURA_HTTP_METRICS_PORT``.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry
from starlette.applications import Starlette
from starlette.routing import BaseRoute
from uvicorn.supervisors import Multiprocess

from services.acceptance.http_api import (
    AcceptanceSettings,
    EventFeed,
    EventSettings,
    acceptance_routes,
    end_streams_on_exit,
    event_routes,
    events_openapi,
)
from services.acceptance.http_api import openapi_paths as acceptance_openapi
from services.common import logs, readiness, tracing
from services.common.api.auth import Authenticator
from services.common.api.body import JsonBody
from services.common.api.context import ApiContext
from services.common.api.keywatch import KeyWatch
from services.common.api.openapi import ERRORS, JSON
from services.common.api.throttle import FailureThrottle
from services.common.db import async_pool
from services.common.ops_server import start_ops_server
from services.delivery.http_api import DeliverySettings, Endpoints, delivery_routes
from services.delivery.http_api import openapi_paths as delivery_openapi
from services.edge import openapi
from services.edge.app import create_app, edge_routes
from services.inference.http_api import review_routes, review_schemas

log = logging.getLogger(__name__)


def openapi_document(settings: AcceptanceSettings) -> JSON:
    """The document ``/openapi.json`` serves: each mounted service's part, and the edge's."""
    components: JSON = {
        **acceptance_openapi.components(settings),
        **events_openapi.COMPONENTS,
        **delivery_openapi.COMPONENTS,
        **review_schemas.COMPONENTS,
    }
    paths: JSON = {
        **acceptance_openapi.paths(openapi.TENANT_SECURITY),
        **events_openapi.paths(openapi.TENANT_SECURITY),
        **delivery_openapi.paths(openapi.TENANT_SECURITY, ERRORS),
        **review_schemas.paths(openapi.REVIEWER_SECURITY, ERRORS),
    }
    return openapi.build(components, paths)


class Mounted:
    """What the mounted services' routes share, built once per worker process."""

    def __init__(self, settings: AcceptanceSettings) -> None:
        self.settings = settings
        # Autocommit: a single read or a single-statement write is one round trip; a multi-statement
        # unit of work still opens its own transaction.
        self.pool = async_pool(
            settings.common,
            name="http",
            max_size=settings.edge_db_pool_max,
            autocommit=True,
            role="edge",
            db_role="fatura_edge",
        )
        throttle = FailureThrottle(settings.auth_failure_limit, 60.0, settings.auth_block_seconds)
        auth = Authenticator(self.pool, settings.auth_cache_seconds, throttle)
        self.context = ApiContext(self.pool, auth, JsonBody(settings.max_body_bytes))
        self.endpoints = Endpoints(self.pool, DeliverySettings.from_env())
        self.events = EventSettings.from_env()
        self.feed = EventFeed(settings.common, self.events, self.pool, name="http", db_role="fatura_edge")
        self.keys = KeyWatch(self.pool, self.events.auth_recheck_seconds)

    def routes(self) -> list[BaseRoute]:
        return [
            *acceptance_routes(self.context, self.settings),
            *event_routes(self.context, self.feed, self.keys, self.events),
            *review_routes(self.context, dict(os.environ)),
            *delivery_routes(self.context, self.endpoints),
            *edge_routes(
                self.context, self.pool, self.settings.common.queue_prefix, openapi_document(self.settings)
            ),
        ]


def create_http_app(settings: AcceptanceSettings) -> Starlette:
    mounted = Mounted(settings)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await mounted.pool.open(wait=False)
        await mounted.feed.start()
        await mounted.keys.start()
        end_streams_on_exit(mounted.feed)
        try:
            yield
        finally:
            await mounted.keys.stop()
            await mounted.feed.stop()
            await mounted.pool.close()

    return create_app(mounted.routes(), lifespan)


def create_app_from_env() -> Starlette:
    """The factory uvicorn calls in each worker process."""
    settings = AcceptanceSettings.from_env()
    # A worker started by uvicorn's supervisor is a fresh interpreter: set it up like its parent.
    if not logging.getLogger().handlers:
        logs.setup(settings.common.log_level, settings.common.log_format)
    tracing.setup("http", trace_file=settings.common.trace_file)
    app = create_http_app(settings)
    tune_gc()
    return app


# A request leaves no cyclic garbage behind, but the objects it holds while in flight (every
# concurrent request's frames, dicts and rows) reach the default 700 new containers within a few
# requests, and each such collection walks them, and a full one every 100 walks all the
# interpreter's ~100,000 objects: together about 6% of the edge's CPU per request. A young
# generation of 50,000 is collected when garbage has piled up, not at every burst of live requests,
# and the objects made at start-up (modules, routes, schemas) are frozen out of every collection.
GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Call once the app is built, in each worker process."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)


def main() -> int:
    settings = AcceptanceSettings.from_env()
    # Checked before any worker starts: a worker that cannot start would be started again forever.
    DeliverySettings.from_env().require_keyring("the HTTP edge (webhook endpoint registration)")
    multiproc_dir: str | None = None
    registry: CollectorRegistry | None = None
    if settings.http_workers > 1:
        from prometheus_client import multiprocess

        multiproc_dir = tempfile.mkdtemp(prefix="fatura-http-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]

    ready = readiness.postgres_connect(settings.common.database_url)
    ops = start_ops_server(settings.metrics_port, ready, registry=registry or REGISTRY)
    config = uvicorn.Config(
        "services.cli.http_edge:create_app_from_env",
        factory=True,
        host=settings.http_host,
        port=settings.http_port,
        workers=settings.http_workers,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.common.log_level.lower(),
        backlog=4096,
        timeout_graceful_shutdown=10,
        server_header=False,
    )
    log.info(
        "HTTP edge on http://%s:%d with %d worker(s); metrics on :%d",
        settings.http_host,
        settings.http_port,
        settings.http_workers,
        settings.metrics_port,
    )
    try:
        if settings.http_workers > 1:
            sock = config.bind_socket()
            Multiprocess(config, sockets=[sock]).run()
        else:
            uvicorn.Server(config).run()
    finally:
        ops.shutdown()
        if multiproc_dir is not None:
            shutil.rmtree(multiproc_dir, ignore_errors=True)
    return 0
