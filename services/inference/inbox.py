"""The execution inbox (DESIGN §2 step 3): each delivered event is recorded once, by event_id.

The same id with a different payload digest is quarantined and counted, never applied and never
overwrites the stored one. The caller acks the message only after ``receive`` has committed.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from services.common.messages import EventMessage
from services.common.queries import load_queries
from services.inference import metrics

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "inference.sql")


class Received(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    QUARANTINED = "quarantined"


def receive(pool: ConnectionPool[Any], event: EventMessage) -> Received:
    params = {
        "event_id": event.event_id,
        "job_id": event.job_id,
        "event_type": event.event_type,
        "digest": event.digest,
    }
    with pool.connection() as conn, conn.transaction():
        if conn.execute(Q["inbox_insert"], params).fetchone() is not None:
            result = Received.NEW
        else:
            stored = conn.execute(Q["inbox_digest"], params).fetchone()
            if stored is not None and stored["payload_digest"] == event.digest:
                result = Received.DUPLICATE
            else:
                conn.execute(
                    Q["inbox_quarantine"],
                    {
                        **params,
                        "stored_digest": stored["payload_digest"] if stored else "",
                        "payload": Jsonb(event.payload),
                    },
                )
                result = Received.QUARANTINED
                log.error(
                    "event %s arrived again with a different payload (digest %s, stored %s): quarantined",
                    event.event_id,
                    event.digest,
                    stored["payload_digest"] if stored else None,
                )
    metrics.INBOX.labels(result.value).inc()
    return result
