"""Group commit for the fast path's ``accept_job`` writes (DESIGN §5.1): requests that arrive while
this process's writers are busy share one transaction, their statements sent together in a pipeline.

Each write is still the whole ``accept_job`` statement with its own idempotency check; only the
transaction (its COMMIT, WAL flush and transaction id) and the round trips are shared. A request is
answered only after the transaction holding its write has committed, so a ``202`` is as durable as
before.

Nothing waits to fill a group: a write starts at once while fewer than ``writers`` transactions are
under way in this process, alone. Only the writes that arrive while all of them are busy queue up,
and the next free writer takes up to ``max_group`` of them together. Under light load every write
goes alone, as before; under heavy load the groups grow and each job costs PostgreSQL and the edge
less (a commit and a round trip shared by several jobs).

Failures are classed as the consumers' group commit classes them (services/common/groupcommit.py,
``failures.is_transient``). A transient one (the connection lost, whether the COMMIT landed is then
unknown; a deadlock; a timeout) fails every write of the group: a 503 at the edge, and its client's
retry with the same Idempotency-Key finds the job or writes it. Any other may be one write's own (a
bad value): the transaction has rolled back, and each write of the group is run again alone, so one
request's failure is never another's.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from typing import Any

from psycopg_pool import AsyncConnectionPool

from services.acceptance.queries import Q
from services.common.db import statement_cursor
from services.common.failures import is_transient
from services.common.groupcommit import GROUP_WRITES

JSON = dict[str, Any]


class GroupWriter:
    """Runs ``accept_job`` for many concurrent requests of one process, grouping those that queue."""

    def __init__(self, pool: AsyncConnectionPool[Any], *, writers: int, max_group: int) -> None:
        if writers < 1 or max_group < 1:
            raise ValueError("writers and max_group must be at least 1")
        self._pool = pool
        self._writers = writers
        self._max_group = max_group
        self._queue: deque[tuple[JSON, asyncio.Future[JSON | None]]] = deque()
        self._running: set[asyncio.Task[None]] = set()
        self._sizes = GROUP_WRITES.labels("accept")

    async def write(self, params: JSON) -> JSON | None:
        """``accept_job`` with ``params``, committed: the new job's row, or None when the key was
        taken first."""
        future: asyncio.Future[JSON | None] = asyncio.get_running_loop().create_future()
        self._queue.append((params, future))
        if len(self._running) < self._writers:
            self._start()
        # Shielded: a request that goes away leaves its write to finish (or fail) with its group,
        # exactly as a single statement already sent would.
        return await asyncio.shield(future)

    def _start(self) -> None:
        # In a context of its own: the writer serves many requests, and carries none's trace.
        task = asyncio.get_running_loop().create_task(self._drain(), context=contextvars.Context())
        self._running.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        """A writer ended. A write queued after its last look at the queue but before this (when it
        still counted as running) gets a writer now; it would wait for the next request otherwise."""
        self._running.discard(task)
        if not self._queue or self._running:
            return
        if task.cancelled():  # the process is stopping: nothing will write them
            while self._queue:
                self._queue.popleft()[1].cancel()
        else:
            self._start()

    async def _drain(self) -> None:
        """One writer: takes the queued writes, up to ``max_group`` at a time, until none are left."""
        group: list[tuple[JSON, asyncio.Future[JSON | None]]] = []
        try:
            while self._queue:
                group = [self._queue.popleft() for _ in range(min(self._max_group, len(self._queue)))]
                try:
                    rows = await self._commit([params for params, _ in group])
                except Exception as exc:
                    if len(group) > 1 and not is_transient(exc):
                        await self._one_by_one(group)
                    else:
                        _fail(group, exc)
                    continue
                for (_, future), row in zip(group, rows, strict=True):
                    if not future.done():
                        future.set_result(row)
        except BaseException:
            # Cancelled (the process is stopping) or a fault of this code: no request waits forever.
            for _, future in group:
                future.cancel()
            raise

    async def _one_by_one(self, group: list[tuple[JSON, asyncio.Future[JSON | None]]]) -> None:
        for params, future in group:
            try:
                (row,) = await self._commit([params])
            except Exception as exc:
                _fail([(params, future)], exc)
            else:
                if not future.done():
                    future.set_result(row)

    async def _commit(self, group: list[JSON]) -> list[JSON | None]:
        """The writes of ``group`` in one transaction (a single write is its own), in one round trip.

        The pool's connections are in autocommit, and the statements of a pipeline that no Sync
        separates are one implicit transaction, committed at the Sync that ends the pipeline or
        rolled back there as a whole when any of them fails (PostgreSQL's protocol, "Pipelining").
        So no BEGIN and COMMIT of their own, each a round trip: the group is sent, and answered,
        at once.
        """
        async with self._pool.connection() as conn:
            if len(group) == 1:
                cursor = statement_cursor(conn, "accept_job")
                row = await (await cursor.execute(Q["accept_job"], group[0])).fetchone()
                self._sizes.observe(1)
                return [row]
            if not conn.autocommit:
                raise RuntimeError("the group writer needs a pool of autocommit connections")
            cursors = [statement_cursor(conn, "accept_job", i) for i in range(len(group))]
            async with conn.pipeline():
                for cursor, params in zip(cursors, group, strict=True):
                    await cursor.execute(Q["accept_job"], params, prepare=True)
            # The pipeline's end synced: every statement has run and the transaction has committed.
            rows = [await cursor.fetchone() for cursor in cursors]
        self._sizes.observe(len(group))
        return rows


def _fail(group: list[tuple[JSON, asyncio.Future[JSON | None]]], exc: BaseException) -> None:
    for _, future in group:
        if not future.done():
            future.set_exception(exc)
