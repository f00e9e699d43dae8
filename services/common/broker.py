"""The RabbitMQ broker every service uses: publisher confirms, quorum queues, and one redelivery
policy decided by the failure's class (``services.common.failures``).

Retries of the *work* live in the database (DESIGN §5.8). What this module retries is the *message*
when a dependency failed under it: the ``Redelivery`` middleware replaces Dramatiq's Retries.

- transient (PostgreSQL, RabbitMQ or Redis away, a pool timeout, a serialization failure): the
  message goes to the queue's delay queue with full-jitter backoff and comes back until the
  dependency is back; never dead-lettered;
- poison (malformed, unknown, conflicting): recorded in ``dead_letters`` with its reason, then
  taken off the queue;
- unexpected (a bug): redelivered like a transient failure a few times, then dead-lettered.

If the dead letter cannot be written, or the delayed copy cannot be published, the message is
neither acked nor dead-lettered: it stays unacked and RabbitMQ hands it out again when the
consumer's connection goes (which is what an outage does) or after ``consumer_timeout``.

Queues are quorum queues from the first day (a queue's type cannot change once declared) with
at-least-once dead-lettering and a delivery limit, so a message that keeps killing workers is
dead-lettered instead of looping (DESIGN §9); the schedulers drain those into ``dead_letters``.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import dramatiq
import pika.exceptions
from dramatiq.brokers.rabbitmq import RabbitmqBroker, _RabbitmqConsumer
from dramatiq.common import q_name
from dramatiq.errors import BrokerConnectionError
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from services.common.confirms import ConfirmChannel, Outgoing
from services.common.failures import Failure, Poison, classify
from services.common.settings import CommonSettings

log = logging.getLogger(__name__)

DELIVERY_LIMIT = 5
REDELIVERIES = "redeliveries"  # message option: how many times this message came back
_HOLD = "fatura_hold"  # proxy option: neither ack nor nack this delivery

DeadLetterHook = Callable[..., object]
"""Called with queue, actor, message_id, reason, detail, message (a dict); raises if not recorded."""


class Redelivery(Retries):
    """Dramatiq's Retries, replaced: the failure's class decides, not a retry count.

    It subclasses Retries so actors keep their ``max_retries=0`` option valid; Dramatiq itself
    never retries a message here.
    """

    def __init__(self, *, min_backoff_ms: int, max_backoff_ms: int, unexpected_limit: int) -> None:
        super().__init__(max_retries=0)
        self.min_backoff_ms = min_backoff_ms
        self.max_backoff_ms = max_backoff_ms
        self.unexpected_limit = unexpected_limit
        self.dead_letter: DeadLetterHook | None = None

    def backoff_ms(self, redeliveries: int) -> int:
        """Full jitter: uniform(0, min(max, min * 2**n)), at least the minimum."""
        ceiling = min(self.max_backoff_ms, self.min_backoff_ms * 2 ** min(redeliveries, 30))
        return max(self.min_backoff_ms, int(random.uniform(0, ceiling)))

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: BaseException | None = None
    ) -> None:
        if exception is None:
            return
        kind = classify(exception)
        redeliveries = int(message.options.get(REDELIVERIES, 0) or 0)
        if kind is Failure.POISON or (kind is Failure.UNEXPECTED and redeliveries >= self.unexpected_limit):
            if isinstance(exception, Poison):
                reason, detail = exception.reason, exception.detail
            else:
                reason = "unexpected_error"
                detail = f"{type(exception).__name__}: {exception} (after {redeliveries} redeliveries)"
            if self._record(message, reason, detail):
                return  # recorded: acked and off the queue
            kind = Failure.TRANSIENT  # could not record: refuse it again later
        delay = self.backoff_ms(redeliveries)
        copy = message.copy(options={REDELIVERIES: redeliveries + 1})
        log.warning(
            "message %s on %s failed (%s: %s: %s); redelivery %d in %d ms",
            message.message_id,
            message.queue_name,
            kind.value,
            type(exception).__name__,
            exception,
            redeliveries + 1,
            delay,
        )
        try:
            broker.enqueue(copy, delay=delay)
        except (BrokerConnectionError, pika.exceptions.AMQPError) as exc:
            log.warning(
                "message %s: could not publish its redelivery (%s); left unacked", message.message_id, exc
            )
            message.options[_HOLD] = True

    def record_poison(self, message: Any, exception: Poison) -> bool:
        """Record ``message`` in ``dead_letters`` for ``exception``'s reason; whether it was recorded.
        For one event of a message that carries several (``services.common.event_batches``)."""
        return self._record(message, exception.reason, exception.detail)

    def _record(self, message: Any, reason: str, detail: str) -> bool:
        if self.dead_letter is None:
            log.error(
                "message %s refused (%s) but this process records no dead letters", message.message_id, reason
            )
            return False
        try:
            self.dead_letter(
                queue=message.queue_name,
                actor=message.actor_name,
                message_id=message.message_id,
                reason=reason,
                detail=detail,
                message=message.asdict(),
            )
        except Exception as exc:
            log.warning(
                "message %s (%s): the dead letter could not be written: %s", message.message_id, reason, exc
            )
            return False
        return True


class _HoldingConsumer(_RabbitmqConsumer):
    """Leaves a held delivery unacked (see ``Redelivery``); acks and nacks everything else."""

    def ack(self, message: Any) -> None:
        if message.options.pop(_HOLD, False):
            self.known_tags.discard(message._tag)
            return
        super().ack(message)  # type: ignore[no-untyped-call]


class QuorumRabbitmqBroker(RabbitmqBroker):
    """RabbitmqBroker whose work and delay queues are quorum queues."""

    @property
    def consumer_class(self) -> type[_RabbitmqConsumer]:
        return _HoldingConsumer

    def _build_queue_arguments(self, queue_name: str) -> dict[str, Any]:
        arguments: dict[str, Any] = super()._build_queue_arguments(queue_name)  # type: ignore[no-untyped-call]
        arguments.update(
            {
                "x-queue-type": "quorum",
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
                "x-delivery-limit": DELIVERY_LIMIT,
            }
        )
        return arguments

    @property
    def redelivery(self) -> Redelivery:
        for middleware in self.middleware:
            if isinstance(middleware, Redelivery):
                return middleware
        raise LookupError("this broker has no Redelivery middleware")

    @contextmanager
    def reconnecting(self) -> Iterator[None]:
        """Around direct channel calls: a closed channel or connection is dropped, so the next call
        opens a fresh one (Dramatiq's enqueue does this itself; its other calls do not), and the
        error comes out as Dramatiq's ``ConnectionError``, a transient failure."""
        try:
            yield
        except (pika.exceptions.AMQPError, OSError) as exc:
            del self.connection
            raise BrokerConnectionError(exc) from None  # type: ignore[no-untyped-call]

    def publish_all(self, messages: Sequence[dramatiq.Message[Any]]) -> list[bool]:
        """Publish ``messages`` together and wait once for all their confirms
        (``services.common.confirms``); whether RabbitMQ took each one.

        A message it did not take (nacked, or returned because its queue is gone) is False and
        may be published again; a connection that fails before every confirm came is dropped and,
        once, a fresh one publishes what was not confirmed. When that fails too, raises
        ``BrokerConnectionError`` (transient): no confirm seen on it counts.
        """
        if not messages:
            return []
        taken = [False] * len(messages)
        for attempt in (1, 2):
            todo = [i for i, ok in enumerate(taken) if not ok]
            try:
                for queue in {messages[i].queue_name for i in todo}:
                    self.declare_queue(queue, ensure=True)
                batch = [messages[i] for i in todo]
                for message in batch:
                    self.emit_before("enqueue", message, None)
                with self.reconnecting():
                    confirmed = self._confirm_channel().publish(
                        [
                            Outgoing(
                                routing_key=m.queue_name,
                                body=m.encode(),
                                message_id=m.message_id,
                                priority=m.options.get("broker_priority"),
                            )
                            for m in batch
                        ]
                    )
            except BrokerConnectionError:
                if attempt == 2:
                    raise
                log.info(
                    "publishing %d messages failed on a stale connection; once more on a fresh one", len(todo)
                )
                continue
            for i, message, ok in zip(todo, batch, confirmed, strict=True):
                taken[i] = ok
                if ok:
                    self.emit_after("enqueue", message, None)
                else:  # redeclared before the next publish to it, in case it was deleted
                    self.queues_pending.add(q_name(message.queue_name))
            break
        return taken

    def _confirm_channel(self) -> ConfirmChannel:
        """This thread's confirm channel (``publish_all``), on this thread's connection."""
        connection = self.connection
        confirm: ConfirmChannel | None = getattr(self.state, "confirm_channel", None)
        if confirm is None or confirm.connection is not connection or not confirm.is_open:
            if confirm is not None:
                confirm.close()
            confirm = self.state.confirm_channel = ConfirmChannel(connection)
        return confirm

    def queue_depths(self, queue_name: str) -> tuple[int, int, int]:
        """Ready messages in the queue, its delay queue and its dead-letter queue."""
        with self.reconnecting():
            counts: tuple[int, int, int] = self.get_queue_message_counts(queue_name)
        return counts

    def keep_alive(self) -> None:
        """Let pika answer heartbeats on this thread's connection while it is idle; a broken
        connection is dropped so the next call opens a fresh one."""
        connection = getattr(self.state, "connection", None)
        if connection is None:
            return
        try:
            connection.process_data_events(time_limit=0)
        except (pika.exceptions.AMQPError, OSError):
            del self.connection


def make_broker(settings: CommonSettings, *, heartbeat: int = 60) -> QuorumRabbitmqBroker:
    """A broker with publisher confirms whose failed messages follow ``Redelivery``. Connects lazily."""
    middleware = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        CurrentMessage(),
        Redelivery(
            min_backoff_ms=settings.redelivery_min_ms,
            max_backoff_ms=settings.redelivery_max_ms,
            unexpected_limit=settings.unexpected_redeliveries,
        ),
    ]
    url = settings.amqp_url
    separator = "&" if "?" in url else "?"
    if "heartbeat=" not in url:
        url = f"{url}{separator}heartbeat={heartbeat}"
    return QuorumRabbitmqBroker(url=url, confirm_delivery=True, middleware=middleware)


def install(broker: QuorumRabbitmqBroker) -> None:
    """Make ``broker`` the global Dramatiq broker (actors bind to it when declared)."""
    dramatiq.set_broker(broker)


def event_message(queue: str, actor: str, event: Mapping[str, Any], event_id: str) -> dramatiq.Message[Any]:
    """An event as the relay and the reconciler publish it: message id = event id (consumers dedup)."""
    return dramatiq.Message(
        queue_name=queue,
        actor_name=actor,
        args=(),
        kwargs={"event": dict(event)},
        options={},
        message_id=event_id,
    )
