"""Event messages as consumers receive them: parsed, checked, and refused with a reason when bad.

The relay sends every event as one keyword argument, ``event``: ids and versions only (DESIGN §5.3),
and, when the job is traced, the W3C ``traceparent`` its consumers continue (an id too).
A job's event names its job (``job_id``); a batch's event names its batch (``batch_id``) instead.
A message that is malformed, of an unknown type or version, or oversized raises ``BadMessage`` (a
``Poison``): the ``Redelivery`` middleware records it in ``dead_letters`` with its reason and takes
it off the queue. It never crashes a worker or blocks the queue, and nothing else changes.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from services.common.events import BATCH_EVENTS
from services.common.failures import Poison
from services.common.tracing import valid as valid_traceparent

MAX_EVENT_BYTES = 8 * 1024


class BadMessage(Poison):
    """A message no consumer can act on. ``reason`` is a short code: malformed, unknown_type,
    unknown_version, too_large, or what the consumer found wrong with it."""


@dataclass(frozen=True)
class EventMessage:
    event_id: uuid.UUID
    event_type: str
    tenant_id: uuid.UUID
    # Exactly one of the two: the job the event is about, or the batch.
    job_id: uuid.UUID | None
    state: str
    state_version: int
    payload: dict[str, Any]
    batch_id: uuid.UUID | None = None

    @property
    def subject_id(self) -> uuid.UUID:
        """The job or batch the event is about (what an inbox row records beside the event id)."""
        subject = self.job_id if self.job_id is not None else self.batch_id
        assert subject is not None  # parse_event requires one
        return subject

    @property
    def traceparent(self) -> str | None:
        """The W3C trace context the event carries, if well formed; a bad one is ignored, never
        refused: tracing is an observer, and the event is good without it."""
        return valid_traceparent(self.payload.get("traceparent"))

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
    batch = event_type in BATCH_EVENTS
    return EventMessage(
        event_id=_uuid(event, "event_id"),
        event_type=event_type,
        tenant_id=_uuid(event, "tenant_id"),
        job_id=None if batch else _uuid(event, "job_id"),
        state=state,
        state_version=version,
        payload=event,
        batch_id=_uuid(event, "batch_id") if batch else None,
    )
