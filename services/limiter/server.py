"""The limiter process: gRPC LimiterService (+ health, reflection) and its ops port (/metrics, /readyz).

``main()`` runs in the foreground until SIGTERM/SIGINT and reloads the pool configuration on SIGHUP.
It refuses to start (exit 2) on a bad setting, and before binding anything when it would listen
beyond loopback with no token and no client certificates to authenticate its callers.
The RPC path is grpc.aio over redis.asyncio on one event loop; the ops port (a thread) reads Redis
through a small blocking client of its own.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY

from services.common import readiness
from services.common.ops_server import start_ops_server
from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.common.redis_pool import connect
from services.common.settings import CommonSettings, SettingsError
from services.limiter.config import ConfigError, ConfigHolder
from services.limiter.errors import LimiterError
from services.limiter.interceptor import TokenInterceptor
from services.limiter.metrics import PoolCollector
from services.limiter.operations import KeyLayout, LimiterOps, ServerLimits
from services.limiter.security import server_credentials
from services.limiter.servicer import LimiterServicer
from services.limiter.settings import LimiterSettings
from services.limiter.store import AsyncRedisStore, RedisStore, connect_async

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LimiterService"].full_name
_HEALTH_INTERVAL_S = 1.0
_GRACE_S = 5.0


def build_ops(settings: LimiterSettings, holder: ConfigHolder) -> LimiterOps:
    limits = ServerLimits(
        default_lease_ms=settings.default_lease_ms,
        max_lease_ms=settings.max_lease_ms,
        max_tokens=settings.max_tokens,
        max_cooldown_ms=settings.max_cooldown_ms,
        permit_retention_ms=settings.permit_retention_ms,
    )
    return LimiterOps(lambda: holder.current, limits, KeyLayout(settings.key_prefix))


async def _watch_redis(
    store: AsyncRedisStore, checker: health.aio.HealthServicer, interval_s: float = _HEALTH_INTERVAL_S
) -> None:
    """Report NOT_SERVING through the standard health service while Redis cannot be reached.

    A ping that fails in a way the store does not translate (a client library's own error on a
    reset connection, say) also means Redis is not known to answer: NOT_SERVING, and the watch goes
    on, so the status follows Redis back when it answers again."""
    last = None
    while True:
        try:
            await store.ping()
            status = health_pb2.HealthCheckResponse.SERVING
        except LimiterError as exc:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
            if last != status:
                log.error("redis unreachable, limiter NOT_SERVING (RPCs answer UNAVAILABLE): %s", exc)
        except Exception:
            status = health_pb2.HealthCheckResponse.NOT_SERVING
            if last != status:
                log.exception("redis ping failed unexpectedly, limiter NOT_SERVING")
        if (
            last == health_pb2.HealthCheckResponse.NOT_SERVING
            and status == health_pb2.HealthCheckResponse.SERVING
        ):
            log.info("redis reachable again, limiter SERVING")
        last = status
        # The service's own name first: whoever sees the server as a whole SERVING finds the
        # service SERVING too.
        for name in (SERVICE_NAME, ""):
            await checker.set(name, status)
        await asyncio.sleep(interval_s)


def _describe_security(settings: LimiterSettings) -> str:
    if settings.tls_client_ca is not None:
        tls = "mutual TLS"
    elif settings.tls_cert is not None:
        tls = "TLS"
    else:
        tls = "plaintext"
    token = "token required" if settings.token is not None else "no token"
    return f"{tls}, {token}, reflection {'on' if settings.reflection else 'off'}"


async def serve(
    common: CommonSettings,
    settings: LimiterSettings,
    holder: ConfigHolder,
    credentials: Any = None,
) -> int:
    """Serve until SIGTERM/SIGINT. ``credentials``: ``grpc.ServerCredentials`` for a TLS port, or
    None for plaintext."""
    ops = build_ops(settings, holder)
    timeout_s = settings.redis_timeout_ms / 1000
    connections = settings.redis_connections
    store = AsyncRedisStore(
        # +1 for the health watcher's PING, which runs beside the pipelines
        connect_async(common.redis_url, timeout_s=timeout_s, max_connections=connections + 1),
        connections,
    )
    # The ops thread (metrics scrapes, /readyz) has its own blocking client: never the event loop's.
    side_store = RedisStore(connect(common.redis_url, timeout_s=timeout_s, max_connections=2))

    server = grpc.aio.server(
        interceptors=[TokenInterceptor(settings.token)] if settings.token is not None else None,
        # Without this a second limiter on the same port would bind silently and share traffic.
        options=[("grpc.so_reuseport", 0)],
    )
    pb_grpc.add_LimiterServiceServicer_to_server(LimiterServicer(ops, store), server)
    checker = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    if settings.reflection:
        names = (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME)
        reflection.enable_server_reflection(names, server)
    address = f"{settings.host}:{settings.port}"
    try:
        if credentials is None:
            server.add_insecure_port(address)
        else:
            server.add_secure_port(address, credentials)
    except RuntimeError as exc:
        log.error("limiter cannot listen on %s: %s", address, exc)
        return 1

    # Asked afresh on every /readyz: the limiter is ready exactly while its Redis answers.
    ready = readiness.redis_ping(side_store.client, cache_seconds=0)
    try:
        ops_server = start_ops_server(settings.metrics_port, ready, host=settings.host)
    except OSError as exc:
        log.error("limiter cannot serve metrics on port %d: %s", settings.metrics_port, exc)
        return 1
    collector = PoolCollector(
        lambda: sorted(holder.current.pools), lambda pool: side_store.execute(ops.pool_status(pool))
    )
    REGISTRY.register(collector)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, holder.reload)

    # Known from the first RPC on (NOT_SERVING, not NOT_FOUND) until the first Redis ping answers.
    for name in (SERVICE_NAME, ""):
        await checker.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await server.start()
    watcher = asyncio.create_task(_watch_redis(store, checker))
    log.info(
        "limiter listening on %s (%s; metrics :%d), pools %s from %s",
        address,
        _describe_security(settings),
        settings.metrics_port,
        sorted(holder.current.pools),
        settings.config_path,
    )
    await stop.wait()
    log.info("limiter stopping")
    watcher.cancel()
    await checker.enter_graceful_shutdown()
    await server.stop(_GRACE_S)
    ops_server.shutdown()
    REGISTRY.unregister(collector)
    await store.close()
    side_store.close()
    log.info("limiter stopped")
    return 0


def main() -> int:
    try:
        common = CommonSettings.from_env()
        settings = LimiterSettings.from_env()
        settings.check_listener()
        credentials = server_credentials(settings)
    except SettingsError as exc:
        log.error("limiter cannot start: bad setting: %s", exc)
        return 2
    try:
        holder = ConfigHolder(settings.config_path)
    except ConfigError as exc:
        log.error("limiter cannot start: %s", exc)
        return 2
    return asyncio.run(serve(common, settings, holder, credentials))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    sys.exit(main())
