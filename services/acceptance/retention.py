"""Job events past ``FATURA_EVENT_RETENTION_HOURS`` are deleted by the relay's housekeeping.

Deletion runs from the oldest event and stops at the first one still within the retention, and it
moves ``job_event_horizon`` over what it deleted in the same statement: a stream resuming from a
cursor below the horizon knows that events it missed are gone, and starts with a snapshot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "feed.sql")


def prune_job_events(pool: Any, retention_seconds: float, *, batch: int = 5000, batches: int = 20) -> int:
    """Delete up to ``batches`` batches of events older than the retention; returns how many.
    ``pool`` is a blocking pool (the relay's); each batch is its own short transaction."""
    deleted = 0
    for _ in range(batches):
        with pool.connection() as conn, conn.transaction():
            row = conn.execute(
                Q["prune_job_events"], {"batch": batch, "seconds": retention_seconds}
            ).fetchone()
        count = int(row["deleted"]) if row else 0
        deleted += count
        if count < batch:
            break
    return deleted
