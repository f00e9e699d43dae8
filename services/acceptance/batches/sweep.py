"""The relay's part in batches: close the running batches every item of which is final.

An item's change closes its batch in its own transaction (``fatura_close_batch``, migration 0013).
When the last two items finish at the same instant, neither transaction sees the other's count and
neither closes it; this sweep, run by the relay every sweep interval, does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool

from services.acceptance import metrics
from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "batches.sql")


def close_finished_batches(pool: ConnectionPool[Any], *, limit: int = 100) -> int:
    """Close up to ``limit`` finished batches; returns how many. ``pool`` is a blocking pool."""
    with pool.connection() as conn:
        row = conn.execute(Q["close_finished_batches"], {"limit": limit}).fetchone()
    closed = int(row["closed"]) if row is not None else 0
    if closed:
        metrics.BATCHES_CLOSED.inc(closed)
    return closed
