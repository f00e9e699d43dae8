"""``fatura run jobs-grpc``: gRPC JobService (+ health, reflection) and its ops port (/metrics, /readyz).

Runs in the foreground until SIGTERM/SIGINT on one event loop: grpc.aio over the same async
PostgreSQL pool kind, database role and acceptance code as the HTTP edge. The standard health
service says NOT_SERVING, and /readyz not ready, while the database does not answer; the process
keeps running and comes back by itself (DESIGN §5.12). A bad setting exits 2 before binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from pathlib import Path
from typing import Any

import grpc
import psycopg
import uvloop
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from psycopg import AsyncConnection
from psycopg.rows import DictRow

from services.acceptance.accept import Acceptor
from services.acceptance.batches import BatchParser, BatchService
from services.acceptance.feed import EventFeed
from services.acceptance.jobs import JobService
from services.acceptance.jobs_grpc.handlers import job_service_handler
from services.acceptance.jobs_grpc.servicer import JobServicer
from services.acceptance.jobs_grpc.settings import JobsGrpcSettings
from services.acceptance.jobs_grpc.watch import Watcher
from services.acceptance.requests import RequestParser
from services.common.api.auth import Authenticator
from services.common.api.keywatch import KeyWatch
from services.common.api.throttle import FailureThrottle
from services.common.db import AsyncPool, async_connect, async_pool
from services.common.ops_server import start_ops_server
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.settings import CommonSettings, SettingsError
from services.common.uow import OutboxNotifier

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["JobService"].full_name
_HEALTH_INTERVAL_S = 1.0
_GRACE_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class DatabaseWatch:
    """Asks PostgreSQL once a second and tells the health service and /readyz what it found.

    It asks on a connection of its own, not the pool's: a pool busy with calls is load, not a
    database away, and must not turn the service NOT_SERVING.
    """

    def __init__(self, common: CommonSettings, checker: health.aio.HealthServicer) -> None:
        self._common = common
        self._checker = checker
        self._conn: AsyncConnection[DictRow] | None = None
        self.problem: str | None = "not checked yet"

    async def check(self) -> str | None:
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await async_connect(
                    self._common, autocommit=True, role="edge", name="jobs-grpc-health", db_role="fatura_edge"
                )
            async with asyncio.timeout(2.0):
                await self._conn.execute("SELECT 1")
        except (psycopg.Error, TimeoutError) as exc:
            await self.close()
            return f"database: {type(exc).__name__}"
        return None

    async def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await conn.close()

    async def run(self) -> None:
        try:
            while True:
                problem = await self.check()
                if problem != self.problem:
                    if problem is None:
                        log.info("database answers: JobService SERVING")
                    else:
                        log.error("%s: JobService NOT_SERVING (calls answer UNAVAILABLE)", problem)
                self.problem = problem
                for name in ("", SERVICE_NAME):
                    await self._checker.set(name, SERVING if problem is None else NOT_SERVING)
                await asyncio.sleep(_HEALTH_INTERVAL_S)
        finally:
            await self.close()

    def ready(self) -> str | None:
        return self.problem


def _read(name: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{name}={path} cannot be read: {exc.strerror}") from None


def server_credentials(settings: JobsGrpcSettings) -> Any:
    """``grpc.ServerCredentials`` for TLS, or None for a plaintext port."""
    if settings.tls_cert is None or settings.tls_key is None:
        return None
    key = _read("FATURA_JOBS_GRPC_TLS_KEY", settings.tls_key)
    cert = _read("FATURA_JOBS_GRPC_TLS_CERT", settings.tls_cert)
    return grpc.ssl_server_credentials([(key, cert)])


def max_request_bytes(settings: JobsGrpcSettings) -> int:
    return max(settings.acceptance.max_body_bytes, settings.acceptance.max_batch_body_bytes)


def build_servicer(
    settings: JobsGrpcSettings, pool: AsyncPool, feed: EventFeed, keys: KeyWatch
) -> JobServicer:
    acceptance = settings.acceptance
    notifier = OutboxNotifier(pool)
    throttle = FailureThrottle(acceptance.auth_failure_limit, 60.0, acceptance.auth_block_seconds)
    parser = RequestParser(acceptance)
    return JobServicer(
        Authenticator(pool, acceptance.auth_cache_seconds, throttle),
        parser,
        Acceptor(pool, notifier, acceptance),
        JobService(pool, notifier),
        BatchParser(acceptance, parser),
        BatchService(pool, notifier, acceptance),
        Watcher(feed, keys, settings.events.heartbeat_seconds),
    )


async def serve(settings: JobsGrpcSettings, credentials: Any = None) -> int:
    pool = async_pool(
        settings.acceptance.common,
        name="jobs-grpc",
        max_size=settings.acceptance.edge_db_pool_max,
        autocommit=True,
        role="edge",
        db_role="fatura_edge",
    )
    server = grpc.aio.server(
        options=[
            # Without this a second process on the same port would bind silently and share traffic.
            ("grpc.so_reuseport", 0),
            # Room for the largest request the HTTP API takes (a batch); the caps are checked after.
            ("grpc.max_receive_message_length", max_request_bytes(settings)),
        ]
    )
    # One reader of the job event log for every Watch of the process, as the edge has for SSE.
    common = settings.acceptance.common
    feed = EventFeed(common, settings.events, pool, name="jobs-grpc", db_role="fatura_edge")
    keys = KeyWatch(pool, settings.events.auth_recheck_seconds)
    server.add_generic_rpc_handlers((job_service_handler(build_servicer(settings, pool, feed, keys)),))
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    if settings.reflection:
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server
        )
    address = f"{settings.host}:{settings.port}"
    try:
        if credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        log.error("jobs-grpc cannot listen on %s: %s", address, exc)
        return 1

    watch = DatabaseWatch(settings.acceptance.common, checker)
    try:
        ops_server = start_ops_server(settings.metrics_port, watch.ready, host=settings.host)
    except OSError as exc:
        log.error("jobs-grpc cannot serve metrics on port %d: %s", settings.metrics_port, exc)
        return 1

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    await pool.open(wait=False)
    await feed.start()
    await keys.start()
    await server.start()
    watcher = asyncio.create_task(watch.run())
    log.info(
        "JobService listening on %s (%s, reflection %s; metrics :%d)",
        address,
        "plaintext" if credentials is None else "TLS",
        "on" if settings.reflection else "off",
        settings.metrics_port,
    )
    await stop.wait()
    log.info("jobs-grpc stopping")
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher
    await checker.enter_graceful_shutdown()
    # Open Watch streams get their end event (resume with after_seq) before the server stops.
    await feed.stop()
    await keys.stop()
    await server.stop(_GRACE_S)
    ops_server.shutdown()
    await pool.close()
    log.info("jobs-grpc stopped")
    return 0


def main() -> int:
    try:
        settings = JobsGrpcSettings.from_env()
        settings.check_listener()
        credentials = server_credentials(settings)
    except SettingsError as exc:
        log.error("jobs-grpc cannot start: bad setting: %s", exc)
        return 2
    # uvloop, as the HTTP edge: on this machine it served about a third more Submits per second.
    return uvloop.run(serve(settings, credentials))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(main())
