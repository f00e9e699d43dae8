"""The RabbitMQ broker every service uses: publisher confirms on, quorum queues, no Dramatiq retries.

Retries live in the database (DESIGN §5.8), so no message is ever retried by Dramatiq: the Retries
middleware stays installed, because it is what marks a failed message failed (nack, so RabbitMQ
dead-letters it; without it Dramatiq acks the message and it is gone), but with ``max_retries=0``
for every actor instead of its default of 20 over 7 days.

Queues are quorum queues from the first day (a queue's type cannot change once declared) with
at-least-once dead-lettering and a delivery limit, so a message that keeps killing workers is
dead-lettered instead of looping (DESIGN §9).
"""

from __future__ import annotations

from typing import Any

import dramatiq
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.middleware import (
    AgeLimit,
    Callbacks,
    CurrentMessage,
    Retries,
    ShutdownNotifications,
    TimeLimit,
)

from services.common.settings import CommonSettings

DELIVERY_LIMIT = 5


class QuorumRabbitmqBroker(RabbitmqBroker):
    """RabbitmqBroker whose work and delay queues are quorum queues."""

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


def make_broker(settings: CommonSettings, *, heartbeat: int = 60) -> QuorumRabbitmqBroker:
    """A broker with publisher confirms whose actors never retry a message. Connects lazily."""
    middleware = [
        AgeLimit(),
        TimeLimit(),
        ShutdownNotifications(),
        Callbacks(),
        CurrentMessage(),
        Retries(max_retries=0),
    ]
    url = settings.amqp_url
    separator = "&" if "?" in url else "?"
    if "heartbeat=" not in url:
        url = f"{url}{separator}heartbeat={heartbeat}"
    return QuorumRabbitmqBroker(url=url, confirm_delivery=True, middleware=middleware)


def install(broker: QuorumRabbitmqBroker) -> None:
    """Make ``broker`` the global Dramatiq broker (actors bind to it when declared)."""
    dramatiq.set_broker(broker)
