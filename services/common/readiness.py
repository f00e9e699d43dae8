"""Readiness: does each dependency of this process answer right now, and what ``/readyz`` says.

``/readyz`` says not-ready while PostgreSQL, RabbitMQ or Redis is away and ready again when it is
back; the process itself keeps running either way (DESIGN §5.12). A probe returns None when the
dependency answers, or a short reason. Probes are cheap: PostgreSQL takes a pooled connection, and
the RabbitMQ and Redis answers are remembered for a second or two. Every ``/readyz`` of the stack
answers through ``verdict``: 200 ``ready``, or 503 ``not ready: REASON``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pika
import psycopg
import redis
from pika.exceptions import AMQPError
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

Probe = Callable[[], str | None]
AsyncProbe = Callable[[], Awaitable[str | None]]


def answer(problem: str | None) -> tuple[int, str]:
    """The status and plain-text body of ``/readyz`` for a probe's answer."""
    if problem is None:
        return 200, "ready\n"
    return 503, f"not ready: {problem}\n"


def verdict(probe: Probe) -> tuple[int, str]:
    """Run ``probe`` and answer for it; a probe that raises means not ready, never a crash."""
    try:
        problem = probe()
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    return answer(problem)


async def verdict_async(probe: AsyncProbe) -> tuple[int, str]:
    """``verdict`` for a probe of an event loop."""
    try:
        problem = await probe()
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    return answer(problem)


def postgres(pool: ConnectionPool[Any], *, timeout: float = 2.0) -> Probe:
    def probe() -> str | None:
        try:
            with pool.connection(timeout=timeout) as conn:
                conn.execute("SELECT 1")
        except (psycopg.Error, PoolTimeout) as exc:
            return f"PostgreSQL: {_first_line(exc)}"
        return None

    return probe


def postgres_connect(url: str, *, timeout: int = 2) -> Probe:
    """A fresh connection each time, for a process that keeps no pool (the edge's supervisor)."""

    def probe() -> str | None:
        try:
            with psycopg.connect(url, connect_timeout=timeout) as conn:
                conn.execute("SELECT 1")
        except psycopg.Error as exc:
            return f"PostgreSQL: {_first_line(exc)}"
        return None

    return probe


def postgres_async(pool: AsyncConnectionPool[Any], *, timeout: float = 2.0) -> AsyncProbe:
    """For the public edge: it names the error's class only, not its message, which carries hosts
    and ports."""

    async def probe() -> str | None:
        try:
            async with pool.connection(timeout=timeout) as conn:
                await conn.execute("SELECT 1")
        except (psycopg.Error, PoolTimeout) as exc:
            return f"database: {type(exc).__name__}"
        return None

    return probe


def rabbitmq(url: str, *, timeout: float = 2.0, cache_seconds: float = 2.0) -> Probe:
    """Opens (and closes) a connection: proves the server answers and takes our credentials."""

    def check() -> str | None:
        params = pika.URLParameters(url)
        params.socket_timeout = timeout
        params.blocked_connection_timeout = timeout
        params.connection_attempts = 1
        params.client_properties = {"connection_name": "fatura-readiness"}
        try:
            pika.BlockingConnection(params).close()
        except (AMQPError, OSError) as exc:
            return f"RabbitMQ: {type(exc).__name__}: {_first_line(exc)}"
        return None

    return cached(check, cache_seconds)


def redis_ping(client: redis.Redis, *, cache_seconds: float = 1.0) -> Probe:
    def check() -> str | None:
        try:
            client.ping()
        except redis.RedisError as exc:
            return f"Redis: {type(exc).__name__}: {_first_line(exc)}"
        return None

    return cached(check, cache_seconds)


def cached(probe: Probe, seconds: float) -> Probe:
    """Remember a probe's answer for ``seconds``; concurrent callers share one check."""
    lock = threading.Lock()
    state: dict[str, Any] = {"at": float("-inf"), "answer": None}

    def remembered() -> str | None:
        with lock:
            if time.monotonic() - state["at"] >= seconds:
                state["answer"] = probe()
                state["at"] = time.monotonic()
            answer: str | None = state["answer"]
            return answer

    return remembered


def all_of(*probes: Probe) -> Probe:
    """Ready when every probe is; otherwise every reason, joined."""

    def check() -> str | None:
        problems = [p for p in (probe() for probe in probes) if p is not None]
        return "; ".join(problems) if problems else None

    return check


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
