"""Group commit: the short writes of several consumer threads in one PostgreSQL transaction.

A consumer thread hands its write to ``GroupCommit.run`` and blocks until the transaction holding
it committed (or failed), so its message is still acknowledged only after its write is durable. One
committer thread takes every write queued meanwhile and runs them, in order, in one transaction:
in a burst, while one transaction commits, the other threads' next writes queue for the next one.
With one consumer thread waiting, it is one write per transaction, as before.

A transaction that fails for a transient reason (DESIGN §5.12) fails every write in it, and each
message comes back as it would alone. Any other failure may be one write's own (a bad event), so
each write of the group is then run again in a transaction of its own: one bad write fails alone.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from prometheus_client import Histogram
from psycopg import Connection
from psycopg_pool import ConnectionPool

from services.common.failures import Unavailable, is_transient

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

GROUP_WRITES = Histogram(
    "fatura_group_commit_writes",
    "Writes committed together in one transaction by a consumer's group commit",
    ["group"],
    buckets=(1, 2, 4, 8, 16, 32, 64),
)
# How long a waiting thread sleeps between looks at whether the committer still runs.
_ALIVE_CHECK_SECONDS = 1.0


@dataclass
class _Write(Generic[T, R]):
    item: T
    done: threading.Event = field(default_factory=threading.Event)
    result: R | None = None
    error: BaseException | None = None


class GroupCommit(Generic[T, R]):
    def __init__(
        self,
        pool: ConnectionPool[Any],
        write: Callable[[Connection[Any], T], R],
        *,
        name: str,
        max_writes: int = 64,
        write_all: Callable[[Connection[Any], list[T]], list[R]] | None = None,
    ) -> None:
        """``write`` runs one item on a connection inside an open transaction and returns what its
        caller gets back once that transaction committed. ``write_all``, when given, runs a whole
        group's items at once instead (in fewer statements), returning their results in order."""
        self._pool = pool
        self._write = write
        self._write_all = write_all
        self._name = name
        self._max = max_writes
        self._queue: list[_Write[T, R]] = []
        self._ready = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=f"group-commit-{name}", daemon=True)
        self._thread.start()

    def run(self, item: T) -> R:
        """Write ``item``; returns once its transaction committed, raises what failed it. Once the
        group commit is closed (the process stops), the write fails as transient: its message comes
        back, to this process or another."""
        outcome = self.run_many([item])[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def run_many(self, items: list[T]) -> list[R | BaseException]:
        """Write several items (one message's events) at once: queued together, so they share the
        next transaction(s). Returns each one's result or what failed it, in order; once closed,
        every write fails as transient."""
        entries: list[_Write[T, R]] = [_Write(item) for item in items]
        with self._ready:
            if self._stopping:
                raise Unavailable(f"group commit {self._name} is closed")
            self._queue.extend(entries)
            self._ready.notify()
        outcomes: list[R | BaseException] = []
        for entry in entries:
            while not entry.done.wait(_ALIVE_CHECK_SECONDS):
                if not self._thread.is_alive():
                    entry.error = Unavailable(f"group commit {self._name} stopped before writing")
                    break
            outcomes.append(entry.error if entry.error is not None else entry.result)  # type: ignore[arg-type]
        return outcomes

    def close(self) -> None:
        """Write what is queued, then stop."""
        with self._ready:
            self._stopping = True
            self._ready.notify()
        self._thread.join(timeout=30.0)

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._stopping:
                    self._ready.wait()
                if not self._queue:
                    return
                group, self._queue = self._queue[: self._max], self._queue[self._max :]
            try:
                self._commit(group)
            except BaseException as exc:  # never leave a caller waiting
                for entry in group:
                    if not entry.done.is_set():
                        entry.error = exc
                        entry.done.set()
                if not isinstance(exc, Exception):
                    raise

    def _commit(self, group: list[_Write[T, R]]) -> None:
        try:
            results = self._transaction(group)
        except Exception as exc:
            if len(group) == 1 or is_transient(exc):
                for entry in group:
                    entry.error = exc
                    entry.done.set()
                return
            log.warning(
                "group commit %s: a transaction of %d writes failed (%s: %s); writing each alone",
                self._name,
                len(group),
                type(exc).__name__,
                exc,
            )
            for entry in group:
                self._commit([entry])
            return
        GROUP_WRITES.labels(self._name).observe(len(group))
        for entry, result in zip(group, results, strict=True):
            entry.result = result
            entry.done.set()

    def _transaction(self, group: list[_Write[T, R]]) -> list[R]:
        with self._pool.connection() as conn, conn.transaction():
            if self._write_all is not None and len(group) > 1:
                return self._write_all(conn, [entry.item for entry in group])
            return [self._write(conn, entry.item) for entry in group]
