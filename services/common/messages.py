"""Event messages as consumers receive them: parsed, checked, and refused with a reason when bad.

The relay sends every event as one keyword argument, ``event``: ids and versions only (DESIGN §5.3).
A message that is malformed, of an unknown type or version, or oversized is refused: the reason is
written to ``dead_letters`` and counted, and the actor raises ``BadMessage`` so the broker
dead-letters the message (Retries with ``max_retries=0`` nacks it). It never crashes a worker or
blocks the queue, and nothing else changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import Counter
from psycopg_pool import ConnectionPool

from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "messages.sql")

MAX_EVENT_BYTES = 8 * 1024
_BODY_EXCERPT = 2_000

BAD_MESSAGES = Counter(
    "fatura_bad_messages_total",
    "Broker messages refused by a consumer and dead-lettered, by queue and reason",
    ["queue", "reason"],
)


class BadMessage(Exception):
    """A message no consumer can act on. ``reason`` is a short code: malformed, unknown_type,
    unknown_version, too_large."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class EventMessage:
    event_id: uuid.UUID
    event_type: str
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    state_version: int
    payload: dict[str, Any]

    @property
    def digest(self) -> str:
        return payload_digest(self.payload)


def payload_digest(payload: dict[str, Any]) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _uuid(payload: dict[str, Any], key: str) -> uuid.UUID:
    value = payload.get(key)
    if not isinstance(value, str):
        raise BadMessage("malformed", f"{key} must be a UUID string, got {type(value).__name__}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadMessage("malformed", f"{key} is not a UUID: {value[:64]!r}") from None


def parse_event(event: Any, accepted_types: Collection[str]) -> EventMessage:
    """The event inside a message, or ``BadMessage`` saying what is wrong with it."""
    if not isinstance(event, dict):
        raise BadMessage("malformed", f"the event must be a JSON object, got {type(event).__name__}")
    size = len(json.dumps(event, default=str))
    if size > MAX_EVENT_BYTES:
        raise BadMessage("too_large", f"the event is {size} bytes; at most {MAX_EVENT_BYTES} are accepted")
    event_type = event.get("event_type")
    if not isinstance(event_type, str):
        raise BadMessage("malformed", "event_type is missing")
    if event_type not in accepted_types:
        family = event_type.rpartition(".")[0]
        if family in {t.rpartition(".")[0] for t in accepted_types}:
            known = sorted(accepted_types)
            raise BadMessage("unknown_version", f"{event_type!r}: this consumer reads {known}")
        raise BadMessage("unknown_type", f"{event_type!r} is not an event this consumer reads")
    state = event.get("state")
    version = event.get("state_version")
    if not isinstance(state, str) or not state:
        raise BadMessage("malformed", "state is missing")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadMessage("malformed", "state_version must be a positive integer")
    return EventMessage(
        event_id=_uuid(event, "event_id"),
        event_type=event_type,
        tenant_id=_uuid(event, "tenant_id"),
        job_id=_uuid(event, "job_id"),
        state=state,
        state_version=version,
        payload=event,
    )


def reject(
    pool: ConnectionPool[Any], queue: str, actor: str, message_id: str | None, error: BadMessage, body: Any
) -> None:
    """Record why a message is refused (best effort: the refusal stands even if this fails)."""
    BAD_MESSAGES.labels(queue, error.reason).inc()
    log.warning("refusing message %s on %s: %s", message_id, queue, error)
    try:
        text = json.dumps(body, default=str)
    except (TypeError, ValueError):
        text = repr(body)
    try:
        with pool.connection() as conn:
            conn.execute(
                Q["record_dead_letter"],
                {
                    "queue": queue,
                    "actor": actor,
                    "message_id": message_id,
                    "reason": error.reason,
                    "detail": error.detail,
                    "body": text[:_BODY_EXCERPT],
                },
            )
    except psycopg.Error as exc:
        log.error("could not record the refusal of message %s: %s", message_id, exc)
