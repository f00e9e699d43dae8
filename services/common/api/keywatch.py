"""Revocation on long sessions: a key revoked while its event stream is open ends that stream.

A request is authenticated once, when it arrives; a stream may stay open for hours. ``KeyWatch``
looks up the keys of every open stream again every few seconds, in one query for all of them, and
calls each stream's ``on_revoked`` for a key that no longer opens anything (revoked, or its rotation
grace ended). While the database does not answer, streams stay open and the next pass tries again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).resolve().parents[1] / "sql" / "auth.sql")

OnRevoked = Callable[[], None]


class KeyWatch:
    def __init__(self, pool: AsyncConnectionPool[Any], interval_seconds: float) -> None:
        self._pool = pool
        self._interval = interval_seconds
        self._watched: dict[str, set[OnRevoked]] = {}
        self._task: asyncio.Task[None] | None = None

    def watch(self, prefix: str, on_revoked: OnRevoked) -> Callable[[], None]:
        """Call ``on_revoked`` once when the key with ``prefix`` stops opening routes; returns the
        function that stops watching (call it when the stream ends)."""
        self._watched.setdefault(prefix, set()).add(on_revoked)

        def unwatch() -> None:
            callbacks = self._watched.get(prefix)
            if callbacks is not None:
                callbacks.discard(on_revoked)
                if not callbacks:
                    del self._watched[prefix]

        return unwatch

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="key-watch")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def check(self) -> int:
        """One pass: end the streams of revoked keys; returns how many streams were told."""
        if not self._watched:
            return 0
        prefixes = sorted(self._watched)
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["live_keys"], {"prefixes": prefixes})).fetchall()
        live = {row["prefix"] for row in rows}
        told = 0
        for prefix in prefixes:
            if prefix in live:
                continue
            for on_revoked in self._watched.pop(prefix, set()):
                on_revoked()
                told += 1
        return told

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check()
            except (psycopg.Error, PoolTimeout) as exc:
                log.warning("could not look up the keys of open streams (%s); they stay open", exc)
