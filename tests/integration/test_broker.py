"""The broker every service shares, against real RabbitMQ with a real Dramatiq worker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import dramatiq
import pika
import pytest
from dramatiq import Worker

from fix_amqp import AMQP_URL
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.settings import CommonSettings


@pytest.fixture
def broker() -> Iterator[tuple[QuorumRabbitmqBroker, str]]:
    queue = f"test-broker-{uuid.uuid4().hex[:8]}.work"
    b = make_broker(CommonSettings())
    yield b, queue
    b.close()
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    channel = connection.channel()
    for suffix in ("", ".DQ", ".XQ"):
        channel.queue_delete(f"{queue}{suffix}")
    connection.close()


def _wait(condition: object, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_a_failing_actor_runs_once_and_its_message_is_dead_lettered_not_retried(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    """Retries live in the database: Dramatiq must neither retry nor silently drop a failed message."""
    b, queue = broker
    calls: list[str] = []
    lock = threading.Lock()

    def boom(event_id: str) -> None:
        with lock:
            calls.append(event_id)
        raise RuntimeError("the actor failed")

    actor = dramatiq.actor(boom, broker=b, actor_name="boom", queue_name=queue)
    worker = Worker(b, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        actor.send("evt-1")
        _wait(lambda: b.get_queue_message_counts(queue)[2] == 1)
        time.sleep(0.5)  # a retry, if one were scheduled, would have been attempted by now
    finally:
        worker.stop()
    assert calls == ["evt-1"]
    assert b.get_queue_message_counts(queue) == (0, 0, 1)


def test_work_queues_declared_by_the_broker_are_quorum_queues(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.declare_queue(queue, ensure=True)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
            channel.queue_declare(queue, durable=True, arguments={"x-queue-type": "classic"})
        assert refused.value.reply_code == 406
    finally:
        connection.close()
