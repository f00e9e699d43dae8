"""Run the step after a job's completion once, however many times the completion is seen (seed 004).

A completion can arrive more than once: a webhook is retried or resent, two pollers race, a poll and
a webhook both report it. Each names the job and its ``state_version``, which together identify
one transition of one job. ``Completions`` records that pair in SQLite in the same transaction as
the step, so a second sighting finds it and the step does not run again; a step that raises is
rolled back and runs on the next sighting.

The step gets the transaction's connection: an effect written through it (a row in your own table)
happens exactly once. An effect outside it (an HTTP call) happens at least once if the process dies
between the step and the commit; make that call idempotent on the same pair.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fatura_sdk.receiver import connect

Step = Callable[[sqlite3.Connection], None]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fatura_completions (
    job_id        TEXT    NOT NULL,
    state_version INTEGER NOT NULL,
    state         TEXT,
    source        TEXT,
    handled_at    REAL    NOT NULL,
    sightings     INTEGER NOT NULL DEFAULT 1,
    PRIMARY KEY (job_id, state_version)
);
"""
_INSERT = """
INSERT INTO fatura_completions (job_id, state_version, state, source, handled_at)
VALUES (:job_id, :state_version, :state, :source, :at)
ON CONFLICT (job_id, state_version) DO NOTHING
"""
_SEEN_AGAIN = """
UPDATE fatura_completions SET sightings = sightings + 1
WHERE job_id = :job_id AND state_version = :state_version
"""


def completion_key(completion: Any) -> tuple[str, int]:
    """``(job_id, state_version)`` of an ``AwaitResult``, a ``JobStatus``, a ``ServerEvent``, a
    verified webhook ``Event`` or a mapping that holds both."""
    for holder in (completion, getattr(completion, "data", None), getattr(completion, "json", None)):
        if isinstance(holder, dict):
            job_id, version = holder.get("job_id"), holder.get("state_version")
        else:
            job_id, version = getattr(holder, "job_id", None), getattr(holder, "state_version", None)
        if isinstance(job_id, str) and isinstance(version, int) and not isinstance(version, bool):
            return job_id, version
    raise ValueError(f"{type(completion).__name__} names no job_id and state_version")


class Completions:
    """``Completions("completions.sqlite").run_once(job_id, state_version, step)``; thread-safe, and
    safe across processes sharing the file (SQLite's write lock orders them)."""

    def __init__(self, db_path: str | Path, *, busy_timeout_s: float = 60.0) -> None:
        self._lock = threading.Lock()
        self._conn = connect(db_path)
        self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._conn.executescript(_SCHEMA)

    def run_once(
        self,
        job_id: str,
        state_version: int,
        step: Step,
        *,
        state: str | None = None,
        source: str | None = None,
    ) -> bool:
        """Run ``step`` unless this completion was handled before; True when it ran now."""
        params = {"job_id": job_id, "state_version": state_version, "state": state, "source": source}
        with self._lock:
            conn = self._conn
            conn.execute("BEGIN IMMEDIATE")
            try:
                if conn.execute(_INSERT, {**params, "at": time.time()}).rowcount == 0:
                    conn.execute(_SEEN_AGAIN, params)
                    conn.execute("COMMIT")
                    return False
                step(conn)
                conn.execute("COMMIT")
                return True
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise

    def handle(self, completion: Any, step: Step, *, source: str | None = None) -> bool:
        """``run_once`` keyed by what ``completion_key`` finds in ``completion``."""
        job_id, version = completion_key(completion)
        state = getattr(completion, "state", None)
        if state is None and isinstance(getattr(completion, "data", None), dict):
            state = completion.data.get("state")
        return self.run_once(
            job_id, version, step, state=state if isinstance(state, str) else None, source=source
        )

    def sightings(self, job_id: str, state_version: int) -> int:
        """How often this completion was seen (0: never handled)."""
        with self.connection() as conn:
            row = conn.execute(
                "SELECT sightings FROM fatura_completions WHERE job_id = ? AND state_version = ?",
                (job_id, state_version),
            ).fetchone()
        return int(row["sightings"]) if row is not None else 0

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The connection, for reading your own tables between completions."""
        with self._lock:
            yield self._conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()
