"""The limiter's Redis health watch survives a ping that fails in a way the store does not translate.

On uvloop, redis-py writing to a connection that a cut had reset raised RuntimeError; the watch ended
on it and the limiter answered SERVING for the rest of the cut. Whatever a ping raises, the watch
reports NOT_SERVING and goes on, so the status follows Redis back."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health, health_pb2

from services.common.settings import CommonSettings
from services.limiter.server import SERVICE_NAME, _watch_redis
from services.limiter.store import AsyncRedisStore, connect_async

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class ResetOnUvloop(AsyncRedisStore):
    """The real store on the real Redis, whose first pings fail as redis-py's did on uvloop."""

    def __init__(self, failures: int) -> None:
        client = connect_async(CommonSettings.from_env().redis_url, timeout_s=1.0, max_connections=2)
        super().__init__(client, lanes=1)
        self.failures = failures

    async def ping(self) -> None:
        if self.failures > 0:
            self.failures -= 1
            raise RuntimeError(
                "unable to perform operation on <TCPTransport closed=True>; the handler is closed"
            )
        await super().ping()


async def _statuses(store: AsyncRedisStore, checker: health.aio.HealthServicer, seconds: float) -> list[int]:
    """The service's status as a client would read it, sampled while the watch runs."""
    watch = asyncio.create_task(_watch_redis(store, checker, interval_s=0.02))
    seen: list[int] = []
    try:
        for _ in range(int(seconds / 0.01)):
            await asyncio.sleep(0.01)
            if watch.done():
                break
            reply = await checker.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME), None)
            if not seen or seen[-1] != reply.status:
                seen.append(reply.status)
    finally:
        alive = not watch.done()
        watch.cancel()
        await store.close()
    assert alive, "the health watch ended"
    return seen


def test_an_untranslated_ping_failure_reports_not_serving_and_the_watch_goes_on() -> None:
    checker = health.aio.HealthServicer()
    seen = asyncio.run(_statuses(ResetOnUvloop(failures=5), checker, seconds=1.0))
    assert seen[0] == NOT_SERVING
    assert seen[-1] == SERVING
