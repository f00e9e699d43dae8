"""The inbox protocol every consumer follows (DESIGN §2 step 3, §5.3): each delivered event is taken
in once, by ``event_id``, inside the consumer's own transaction.

The same id again with the same payload digest is a duplicate (at-least-once delivery: nothing to
do). The same id with a different digest is quarantined in ``inbox_quarantine`` and never applied
nor allowed to overwrite what was taken in; the consumer then refuses the message as poison, so it
is also a dead letter an operator sees.
"""

from __future__ import annotations

import logging
from enum import StrEnum
from pathlib import Path
from typing import Any

from prometheus_client import Counter
from psycopg import Connection, sql
from psycopg.types.json import Jsonb

from services.common.messages import BadMessage, EventMessage
from services.common.queries import load_queries

log = logging.getLogger(__name__)
_Q = load_queries(Path(__file__).with_name("sql") / "inbox.sql")

EXECUTION = "execution_inbox"
DELIVERY = "delivery_inbox"
# Composed once, as text: a composed query would be rendered again on every execution.
_QUERIES = {
    name: {
        key: sql.SQL(text.replace("{check}", "{{check}}")).format(inbox=sql.Identifier(name)).as_string(None)
        for key, text in _Q.items()
    }
    for name in (EXECUTION, DELIVERY)
}

EVENTS = Counter(
    "fatura_inbox_events_total", "Events a consumer's inbox received, by result", ["inbox", "result"]
)


class Received(StrEnum):
    NEW = "new"
    DUPLICATE = "duplicate"
    QUARANTINED = "quarantined"


def take(conn: Connection[Any], inbox: str, event: EventMessage) -> Received:
    """Record ``event`` in ``inbox`` on ``conn``, inside the caller's open transaction."""
    params = _params(event)
    if conn.execute(_QUERIES[inbox]["insert"], params).fetchone() is not None:
        return _counted(inbox, Received.NEW)
    return _not_new(conn, inbox, event, params)


def take_and_check(
    conn: Connection[Any], inbox: str, event: EventMessage, check: str
) -> tuple[Received, bool]:
    """``take``, with the consumer's ``check`` (a boolean SQL expression over the event's
    ``event_id``, ``job_id``, ``event_type`` and ``digest`` parameters, composed once by the caller)
    evaluated in the same statement; its answer is False unless the event is new."""
    params = _params(event)
    query = _checked_queries(inbox, check)
    row = conn.execute(query, params).fetchone()
    assert row is not None, "the statement always returns its one row"
    if row["new"]:
        return _counted(inbox, Received.NEW), bool(row["checked"])
    return _not_new(conn, inbox, event, params), False


def take_all_and_check(
    conn: Connection[Any], inbox: str, events: list[EventMessage], check: str
) -> list[tuple[Received, bool]]:
    """``take_and_check`` for each of ``events``, in order, with the inserts and checks of all of
    them in one statement (a group commit's writes: one round trip, not one per event). An event
    that is not new (seen before, or earlier in ``events``) then goes the way ``take`` sends it."""
    if not events:
        return []
    params = {
        "event_ids": [e.event_id for e in events],
        "job_ids": [e.subject_id for e in events],
        "event_types": [e.event_type for e in events],
        "digests": [e.digest for e in events],
    }
    rows = conn.execute(_checked_queries(inbox, check, "insert_all_and_check"), params).fetchall()
    inserted = {row["event_id"]: bool(row["checked"]) for row in rows}
    results: list[tuple[Received, bool]] = []
    for event in events:
        checked = inserted.pop(event.event_id, None)  # only an id's first event is the new one
        if checked is not None:
            results.append((_counted(inbox, Received.NEW), checked))
        else:
            results.append((_not_new(conn, inbox, event, _params(event)), False))
    return results


# A check's placeholders, as the columns of the group statement's events.
_CHECK_COLUMNS = {
    "%(event_id)s": "g.event_id",
    "%(job_id)s": "g.job_id",
    "%(event_type)s": "g.event_type",
    "%(digest)s": "g.payload_digest",
}
_CHECKED: dict[tuple[str, str, str], str] = {}


def _checked_queries(inbox: str, check: str, name: str = "insert_and_check") -> str:
    key = (inbox, check, name)
    query = _CHECKED.get(key)
    if query is None:
        if name == "insert_all_and_check":
            for placeholder, column in _CHECK_COLUMNS.items():
                check = check.replace(placeholder, column)
        query = _CHECKED[key] = _QUERIES[inbox][name].replace("{check}", check)
    return query


def _params(event: EventMessage) -> dict[str, Any]:
    return {
        "event_id": event.event_id,
        # The inbox's job_id column holds the event's subject: its job, or its batch.
        "job_id": event.subject_id,
        "event_type": event.event_type,
        "digest": event.digest,
    }


def _counted(inbox: str, result: Received) -> Received:
    EVENTS.labels(inbox, result.value).inc()
    return result


def _not_new(conn: Connection[Any], inbox: str, event: EventMessage, params: dict[str, Any]) -> Received:
    q = _QUERIES[inbox]
    stored = conn.execute(q["stored_digest"], params).fetchone()
    stored_digest = stored["payload_digest"] if stored else ""
    if stored_digest == event.digest:
        return _counted(inbox, Received.DUPLICATE)
    conn.execute(
        q["quarantine"],
        {
            **params,
            "inbox_name": inbox,
            "stored_digest": stored_digest,
            "payload": Jsonb(event.payload),
        },
    )
    log.error(
        "%s: event %s arrived again with a different payload (digest %s, stored %s): quarantined",
        inbox,
        event.event_id,
        event.digest,
        stored_digest,
    )
    return _counted(inbox, Received.QUARANTINED)


def conflict(event: EventMessage) -> BadMessage:
    """The refusal of a quarantined event, raised by the consumer after its transaction committed."""
    detail = f"event {event.event_id} arrived again with a different payload; the first one stands"
    return BadMessage("digest_conflict", detail)
