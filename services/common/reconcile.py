"""The reconciler: the database is the truth, so work a lost message would strand is found there.

RabbitMQ messages are hints. If one is lost (a queue purged, a message dropped, a consumer that
took it and died in a way nothing redelivers), the work it stood for must still happen within one
sweep (DESIGN §5.12). Each consumer's scheduler sweeps for its own kind of loss:

- an event the relay published long enough ago that no consumer inbox recorded: published again to
  that consumer (``EventReconciler``; the inbox dedups, so a needless re-drive changes nothing);
- a due job with no wake-up queued: the inference scheduler's top-up;
- a due delivery nobody woke lately: the delivery scheduler's wake-ups.

Every re-drive is counted in ``fatura_reconciler_redriven_total{kind}`` and logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client import Counter
from psycopg import sql
from psycopg_pool import ConnectionPool

from services.common.broker import QuorumRabbitmqBroker, event_message
from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "reconcile.sql")

REDRIVEN = Counter(
    "fatura_reconciler_redriven_total",
    "Work the reconciler found stranded in the database and drove again, by kind",
    ["kind"],
)


class EventReconciler:
    """Re-drives events that one consumer's inbox never recorded.

    A sweep only looks while the consumer's queue (and its delay queue) is empty: events waiting
    behind a backlog are not lost, only late. It keeps a watermark of ``published_at`` below which
    every event is known to be taken in, so each sweep reads only what is new since the last one.
    """

    def __init__(
        self,
        pool: ConnectionPool[Any],
        broker: QuorumRabbitmqBroker,
        *,
        kind: str,
        queue: str,
        actor: str,
        event_types: Collection[str],
        inbox_table: str,
        grace_seconds: float,
        horizon_seconds: float,
        batch: int = 200,
    ) -> None:
        self._pool = pool
        self._broker = broker
        self.kind = kind
        self.queue = queue
        self._actor = actor
        self._types = sorted(event_types)
        self._query = sql.SQL(Q["unconsumed_events"]).format(inbox=sql.Identifier(inbox_table))
        self._grace = grace_seconds
        self._horizon = horizon_seconds
        self._batch = batch
        self._low: datetime | None = None
        # An event re-driven recently is not re-driven again until its copy had time to arrive.
        self._recent: dict[str, float] = {}

    def sweep(self) -> int:
        """One pass; returns how many events were published again."""
        ready, delayed, _ = self._broker.queue_depths(self.queue)
        if ready or delayed:
            return 0
        params = {
            "low": self._low,
            "horizon": self._horizon,
            "grace": self._grace,
            "types": self._types,
            "batch": self._batch,
        }
        with self._pool.connection() as conn:
            rows = conn.execute(self._query, params).fetchall()
            upto = conn.execute(Q["settled_upto"], {"grace": self._grace}).fetchone()
        if not rows:
            self._low = upto["upto"] if upto else self._low
            return 0
        # Stay below the first event still missing, so the next sweep looks at it again.
        self._low = rows[0]["published_at"] - timedelta(microseconds=1)
        now = time.monotonic()
        cooldown = max(self._grace, 30.0)
        self._recent = {k: t for k, t in self._recent.items() if now - t < cooldown}
        sent = 0
        for row in rows:
            event_id = str(row["event_id"])
            if event_id in self._recent:
                continue
            self._broker.enqueue(event_message(self.queue, self._actor, row["payload"], event_id))
            self._recent[event_id] = now
            sent += 1
            log.warning(
                "reconciler: %s event %s (%s) was published at %s and never taken in; published again",
                self.kind,
                event_id,
                row["event_type"],
                row["published_at"].isoformat(),
            )
        REDRIVEN.labels(self.kind).inc(sent)
        return sent


def count(kind: str, n: int) -> None:
    """Count ``n`` re-drives of ``kind`` done by a scheduler's own sweep."""
    if n:
        REDRIVEN.labels(kind).inc(n)
