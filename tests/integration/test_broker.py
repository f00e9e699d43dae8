"""The broker every service shares, against real RabbitMQ with a real Dramatiq worker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dramatiq
import pika
import psycopg
import psycopg_pool
import pytest
from dramatiq import Worker

from fix_amqp import AMQP_URL
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.messages import BadMessage
from services.common.settings import CommonSettings


@pytest.fixture
def broker() -> Iterator[tuple[QuorumRabbitmqBroker, str]]:
    queue = f"test-broker-{uuid.uuid4().hex[:8]}.work"
    b = make_broker(CommonSettings(redelivery_min_ms=50, redelivery_max_ms=200, unexpected_redeliveries=2))
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


class Recorder:
    """Stands in for ``deadletters.record``: keeps what it was asked to record, or refuses."""

    def __init__(self) -> None:
        self.letters: list[dict[str, Any]] = []
        self.refuse = False

    def __call__(self, **letter: Any) -> int:
        if self.refuse:
            raise psycopg.OperationalError("the database is away")
        self.letters.append(letter)
        return len(self.letters)


@contextmanager
def running(b: QuorumRabbitmqBroker) -> Iterator[None]:
    worker = Worker(b, worker_threads=1, worker_timeout=100)
    worker.start()
    try:
        yield
    finally:
        worker.stop()


def _actor(b: QuorumRabbitmqBroker, queue: str, failures: list[BaseException]) -> tuple[Any, list[str]]:
    """An actor that raises the given failures in turn, then succeeds; returns it and its calls."""
    calls: list[str] = []
    lock = threading.Lock()

    def work(event_id: str) -> None:
        with lock:
            calls.append(event_id)
            n = len(calls)
        if n <= len(failures):
            raise failures[n - 1]

    return dramatiq.actor(work, broker=b, actor_name="work", queue_name=queue, max_retries=0), calls


def test_a_message_that_met_a_database_outage_comes_back_until_it_succeeds_and_is_never_dead_lettered(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.redelivery.dead_letter = recorder = Recorder()
    outage = [
        psycopg.OperationalError("connection refused"),
        psycopg_pool.PoolTimeout("couldn't get a connection after 10.00 sec"),
        psycopg.errors.SerializationFailure("could not serialize access"),
    ]
    actor, calls = _actor(b, queue, outage)
    with running(b):
        actor.send("evt-1")
        _wait(lambda: len(calls) == 4)
        time.sleep(0.3)
    assert calls == ["evt-1"] * 4
    assert recorder.letters == []
    assert b.get_queue_message_counts(queue) == (0, 0, 0)


def test_a_poison_message_is_recorded_once_with_its_reason_and_taken_off_the_queue(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.redelivery.dead_letter = recorder = Recorder()
    actor, calls = _actor(b, queue, [BadMessage("malformed", "event_id is not a UUID")] * 10)
    with running(b):
        message = actor.send("evt-2")
        _wait(lambda: len(recorder.letters) == 1)
        time.sleep(0.3)
    assert calls == ["evt-2"]
    (letter,) = recorder.letters
    assert (letter["reason"], letter["detail"], letter["message_id"]) == (
        "malformed",
        "event_id is not a UUID",
        message.message_id,
    )
    assert list(letter["message"]["args"]) == ["evt-2"]
    assert b.get_queue_message_counts(queue) == (0, 0, 0)


def test_an_unexpected_error_is_redelivered_a_few_times_then_dead_lettered_with_its_reason(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.redelivery.dead_letter = recorder = Recorder()
    actor, calls = _actor(b, queue, [RuntimeError("a bug")] * 10)
    with running(b):
        actor.send("evt-3")
        _wait(lambda: len(recorder.letters) == 1)
        time.sleep(0.3)
    assert calls == ["evt-3"] * 3  # the first delivery and unexpected_redeliveries=2 more
    assert recorder.letters[0]["reason"] == "unexpected_error"
    assert "RuntimeError: a bug" in recorder.letters[0]["detail"]
    assert b.get_queue_message_counts(queue) == (0, 0, 0)


def test_a_poison_message_whose_dead_letter_cannot_be_written_is_kept_until_it_can(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.redelivery.dead_letter = recorder = Recorder()
    recorder.refuse = True
    actor, calls = _actor(b, queue, [BadMessage("unknown_type", "'invoice.paid.v1'")] * 100)
    with running(b):
        actor.send("evt-4")
        _wait(lambda: len(calls) >= 3)  # refused, not dropped: it keeps coming back
        recorder.refuse = False
        _wait(lambda: len(recorder.letters) == 1)
        time.sleep(0.3)
    assert recorder.letters[0]["reason"] == "unknown_type"
    assert b.get_queue_message_counts(queue) == (0, 0, 0)


def test_a_publisher_recovers_from_a_closed_channel_and_a_closed_connection(
    broker: tuple[QuorumRabbitmqBroker, str],
) -> None:
    b, queue = broker
    b.declare_queue(queue, ensure=True)
    b.enqueue(dramatiq.Message(queue_name=queue, actor_name="x", args=(), kwargs={}, options={}))
    assert b.queue_depths(queue)[0] == 1
    # When the channel is closed under it (as RabbitMQ does on a channel error)...
    b.channel.close()
    b.enqueue(dramatiq.Message(queue_name=queue, actor_name="x", args=(), kwargs={}, options={}))
    # ...and then the whole connection
    b.connection.close()
    with pytest.raises(dramatiq.errors.BrokerConnectionError):
        b.queue_depths(queue)  # the first call after the loss reports it...
    # Then the next calls open a fresh connection and go on
    b.enqueue(dramatiq.Message(queue_name=queue, actor_name="x", args=(), kwargs={}, options={}))
    assert b.queue_depths(queue)[0] == 3


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
