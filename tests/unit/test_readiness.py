"""Every ``/readyz`` of the stack answers the same way: 200 ``ready``, or 503 with the reason."""

from __future__ import annotations

import asyncio

from services.common import readiness
from services.common.ops_server import ops_app


def test_every_readyz_answers_the_same_way() -> None:
    def broken() -> str | None:
        raise RuntimeError("boom")

    assert readiness.verdict(lambda: None) == (200, "ready\n")
    assert readiness.verdict(lambda: "Redis: away") == (503, "not ready: Redis: away\n")
    assert readiness.verdict(broken) == (503, "not ready: RuntimeError: boom\n")

    seen: list[str] = []
    app = ops_app(lambda: "PostgreSQL: away")
    body = app({"PATH_INFO": "/readyz"}, lambda line, headers: seen.append(line))
    assert seen == ["503 Service Unavailable"] and b"".join(body) == b"not ready: PostgreSQL: away\n"


def test_a_probe_of_an_event_loop_answers_the_same_way() -> None:
    async def away() -> str | None:
        return "database: OperationalError"

    async def broken() -> str | None:
        raise OSError("no route")

    assert asyncio.run(readiness.verdict_async(away)) == (503, "not ready: database: OperationalError\n")
    assert asyncio.run(readiness.verdict_async(broken)) == (503, "not ready: OSError: no route\n")
