"""A message of several events (services/common/event_batches.py): a bad event is dead-lettered by
itself, once, and only when the message will not come back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import dramatiq
import psycopg
import pytest
from dramatiq.middleware import CurrentMessage

from services.common.event_batches import take_all
from services.common.messages import BadMessage, EventMessage

TYPES = frozenset({"extraction.requested.v1"})


class Recorder:
    """Stands in for the broker's Redelivery middleware: the dead letters it was asked to write."""

    def __init__(self) -> None:
        self.recorded: list[tuple[str, str, dict[str, Any]]] = []

    def record_poison(self, message: dramatiq.Message[Any], exception: BadMessage) -> bool:
        self.recorded.append((message.message_id, exception.reason, message.kwargs))
        return True


class Broker:
    def __init__(self) -> None:
        self.redelivery = Recorder()


def event(event_type: str = "extraction.requested.v1") -> dict[str, Any]:
    return {
        "event_id": str(uuid.uuid4()),
        "event_type": event_type,
        "tenant_id": str(uuid.uuid4()),
        "job_id": str(uuid.uuid4()),
        "state": "READY",
        "state_version": 1,
    }


@pytest.fixture(autouse=True)
def current_message() -> Iterator[None]:
    token = CurrentMessage._MESSAGE.set(
        dramatiq.Message(
            queue_name="q", actor_name="ingest", args=(), kwargs={}, options={}, message_id="pack"
        )
    )
    yield
    CurrentMessage._MESSAGE.reset(token)


def test_a_bad_event_is_dead_lettered_alone_only_once_the_message_will_not_come_back() -> None:
    good, other, bad = event(), event(), event("invoice.paid.v1")
    broker = Broker()
    taken: list[uuid.UUID] = []
    blip = psycopg.OperationalError("the server closed the connection")

    def blipping(parsed: list[EventMessage]) -> list[object]:
        return ["new", blip]

    # When a write of the message meets a dependency blip, the failure is raised and no dead letter
    # is written: the message comes back whole
    with pytest.raises(psycopg.OperationalError):
        take_all(broker, [good, bad, other], TYPES, blipping, lambda m, r: taken.append(m.event_id))  # type: ignore[arg-type]
    assert broker.redelivery.recorded == []
    # When it comes back and every write goes through, each good one is taken in and the bad one is
    # dead-lettered once, as the one-event message it would have been
    take_all(
        broker, [good, bad, other], TYPES, lambda p: ["dup", "new"], lambda m, r: taken.append(m.event_id)
    )  # type: ignore[arg-type]
    assert broker.redelivery.recorded == [(bad["event_id"], "unknown_type", {"event": bad})]
    assert taken == [uuid.UUID(good["event_id"]), uuid.UUID(good["event_id"]), uuid.UUID(other["event_id"])]


def test_a_write_refused_as_poison_is_dead_lettered_alone_and_the_others_are_taken_in() -> None:
    first, second = event(), event()
    broker = Broker()
    taken: list[uuid.UUID] = []
    take_all(
        broker,  # type: ignore[arg-type]
        [first, second],
        TYPES,
        lambda p: [BadMessage("unknown_job", "no such job"), "new"],
        lambda m, r: taken.append(m.event_id),
    )
    assert broker.redelivery.recorded == [(first["event_id"], "unknown_job", {"event": first})]
    assert taken == [uuid.UUID(second["event_id"])]
