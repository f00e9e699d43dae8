"""RabbitMQ fixtures: a queue prefix of this run's own, a consumer that reads what the relay published."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions
import pytest

AMQP_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"


# Every queue a process of the stack declares under a prefix (Dramatiq adds .DQ and .XQ to each).
STACK_QUEUES = ("inference.ingest", "inference.run", "delivery.ingest", "delivery.deliver")


def delete_queues(prefix: str) -> None:
    """Delete the stack's queues under ``prefix``: quorum queues are heavy, and a run must not leave
    hundreds behind on the shared RabbitMQ."""
    delete_named_queues([f"{prefix}.{queue}" for queue in STACK_QUEUES])


def delete_named_queues(names: list[str]) -> None:
    """Delete each queue named, with the delay and dead-letter queues Dramatiq adds to it."""
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        for name in names:
            for suffix in ("", ".DQ", ".XQ"):
                channel.queue_delete(f"{name}{suffix}")
    finally:
        connection.close()


@pytest.fixture(scope="session")
def queue_prefix() -> Iterator[str]:
    prefix = f"test-{uuid.uuid4().hex[:8]}"
    yield prefix
    delete_queues(prefix)


@dataclass(frozen=True)
class Delivered:
    """One event as a queue delivered it: a message of several events is one of these per event."""

    message_id: str  # of the message that carried it (the event id when it came alone)
    actor_name: str
    event: dict[str, Any]
    raw: dict[str, Any]

    @property
    def event_id(self) -> str:
        return str(self.event["event_id"])


class QueueReader:
    """Drains a queue with basic_get and acks what it read (a consumer seeing every delivery)."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        self.channel = self.connection.channel()

    def drain(self) -> list[Delivered]:
        found: list[Delivered] = []
        while True:
            try:
                method, _props, body = self.channel.basic_get(self.queue, auto_ack=False)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:  # 404: nobody has declared the queue yet
                    raise
                self.channel = self.connection.channel()
                return found
            if method is None:
                return found
            message = json.loads(body)
            kwargs = message["kwargs"]
            for event in kwargs["events"] if "events" in kwargs else [kwargs["event"]]:
                found.append(Delivered(message["message_id"], message["actor_name"], event, message))
            self.channel.basic_ack(method.delivery_tag)

    def close(self) -> None:
        self.connection.close()


@pytest.fixture
def inference_queue(queue_prefix: str) -> Iterator[QueueReader]:
    reader = QueueReader(f"{queue_prefix}.inference.ingest")
    yield reader
    reader.close()
