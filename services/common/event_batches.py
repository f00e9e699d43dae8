"""Messages that carry several events: how the relay packs them and how a consumer takes them in.

A message costs far more than the event in it: RabbitMQ stores and confirms each one on its quorum
queue, the relay serializes and publishes it, the consumer fetches, dispatches and acks it. So the
relay sends the events of one claimed batch that go to the same queue together, up to
``FATURA_RELAY_EVENTS_PER_MESSAGE`` in one message, as the keyword argument ``events`` (a list of
what ``event`` holds alone). A message of one event keeps the one-event form, ``event``, with the
event id as its message id; consumers take both forms (a relay of the previous release still sends
the first).

Nothing else changes. Each event is deduplicated by its own id in the consumer's inbox, so a
message that comes back (a crash before the ack, a transient failure) brings its events back as
duplicates. A bad event does not take its neighbours down: it is recorded in ``dead_letters`` by
itself, as the one-event message it would have come in alone (its event id as the message id, so
an operator re-drives it like any other), and the rest are taken in. Only a message whose envelope
is wrong (``events`` not a list of 1 to ``MAX_EVENTS_PER_MESSAGE``, or both forms at once) is
refused whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any, TypeVar

import dramatiq
from dramatiq.middleware import CurrentMessage

from services.common import logs, tracing
from services.common.broker import QuorumRabbitmqBroker
from services.common.events import MAX_EVENTS_PER_MESSAGE
from services.common.failures import Poison, Unavailable
from services.common.messages import BadMessage, EventMessage, parse_event

R = TypeVar("R")


def events_message(
    queue: str, actor: str, events: Sequence[dict[str, Any]], message_id: str
) -> dramatiq.Message[Any]:
    """Several events in one message, as the relay publishes them."""
    return dramatiq.Message(
        queue_name=queue,
        actor_name=actor,
        args=(),
        kwargs={"events": [dict(event) for event in events]},
        options={},
        message_id=message_id,
    )


def pack_id(event_ids: Sequence[str]) -> str:
    """A message id for a pack of events: the same events in the same order give the same id."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "fatura:events:" + ",".join(event_ids)))


def consuming(message: EventMessage) -> AbstractContextManager[object]:
    """The consumer's span and log fields for one event, whichever form its message had."""
    stack = ExitStack()
    stack.enter_context(
        tracing.span(
            f"ingest {message.event_type}",
            message.traceparent,
            {"job_id": str(message.job_id), "messaging.message.id": str(message.event_id)},
            kind=tracing.SpanKind.CONSUMER,
        )
    )
    stack.enter_context(logs.bound(job_id=message.job_id, tenant_id=message.tenant_id))
    return stack


def carried(event: Any, events: Any) -> list[Any] | None:
    """The events of a message in the several-events form, or None for the one-event form; raises
    ``BadMessage`` for an envelope no event can be read from."""
    if events is None:
        return None
    if event is not None:
        raise BadMessage("malformed", "a message carries either event or events, not both")
    if not isinstance(events, list) or not 1 <= len(events) <= MAX_EVENTS_PER_MESSAGE:
        raise BadMessage("malformed", f"events must be a list of 1 to {MAX_EVENTS_PER_MESSAGE} events")
    return events


def take_all(
    broker: QuorumRabbitmqBroker,
    events: list[Any],
    accepted: Collection[str],
    write: Callable[[list[EventMessage]], Sequence[R | BaseException]],
    then: Callable[[EventMessage, R], None],
) -> None:
    """Take a message's events in: the well-formed ones written together (``write``, such as
    ``GroupCommit.run_many``), then ``then`` for each one taken in. A bad event (refused by the
    parser, its write or ``then`` as poison) is dead-lettered by itself, once the rest are done.
    Any other failure is raised instead, and nothing is dead-lettered: the whole message comes back,
    the events already taken in return as duplicates and the bad ones are refused then, so each is
    recorded once."""
    parsed: list[tuple[int, EventMessage]] = []
    refused: list[tuple[Any, Poison, int]] = []
    for index, event in enumerate(events):
        try:
            parsed.append((index, parse_event(event, accepted)))
        except BadMessage as exc:
            refused.append((event, exc, index))
    outcomes = write([message for _, message in parsed]) if parsed else []
    failure: BaseException | None = None
    for (index, message), outcome in zip(parsed, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            if isinstance(outcome, Poison):
                refused.append((message.payload, outcome, index))
            elif failure is None:
                failure = outcome
            continue
        try:
            then(message, outcome)
        except Poison as exc:
            refused.append((message.payload, exc, index))
    if failure is not None:
        raise failure
    for event, why, index in refused:
        refuse_alone(broker, event, why, index)


def refuse_alone(broker: QuorumRabbitmqBroker, event: Any, exc: Poison, index: int) -> None:
    """Record one event of the message being processed in ``dead_letters``, as the one-event message
    it would have been; raises ``Unavailable`` when that fails (the whole message comes back)."""
    message = CurrentMessage.get_current_message()
    if message is None:  # pragma: no cover - only ever called from an actor
        raise RuntimeError("refuse_alone outside a message")
    event_id = event.get("event_id") if isinstance(event, dict) else None
    # Its own id when it has one that reads as an id; else its place in the message.
    if isinstance(event_id, str) and 0 < len(event_id) <= 64 and event_id.isprintable():
        message_id = event_id
    else:
        message_id = f"{message.message_id}/{index}"
    alone: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=message.queue_name,
        actor_name=message.actor_name,
        args=(),
        kwargs={"event": event},
        options={},
        message_id=message_id,
    )
    if not broker.redelivery.record_poison(alone, exc):
        raise Unavailable(f"event {message_id} of message {message.message_id} could not be dead-lettered")
