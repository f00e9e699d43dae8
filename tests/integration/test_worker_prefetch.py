"""A worker process holds as many unacknowledged messages per queue as it was given, not more: the
rest stay ready in RabbitMQ for other workers (the delivery worker asks for four per thread)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import dramatiq
import pika
import pytest

from fix_amqp import AMQP_URL
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.settings import CommonSettings
from services.common.worker import run_worker
from services.delivery.settings import DeliverySettings

MESSAGES = 7


def _ready(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        return int(connection.channel().queue_declare(queue, passive=True).method.message_count)
    finally:
        connection.close()


def _settle(queue: str, seconds: float = 10.0) -> int:
    """The queue's ready count once it has held still for half a second."""
    deadline = time.monotonic() + seconds
    last, since = _ready(queue), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = _ready(queue)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= 0.5:
            break
    return last


@pytest.fixture
def queue() -> Iterator[str]:
    name = f"test-prefetch-{uuid.uuid4().hex[:8]}"
    yield name
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        for suffix in ("", ".DQ", ".XQ"):
            channel.queue_delete(f"{name}{suffix}")
    finally:
        connection.close()


def _run(queue: str, prefetch: int | None) -> int:
    """Start a one-thread worker whose actor blocks, queue MESSAGES, and return how many stayed
    ready in RabbitMQ while the one in hand was held."""
    broker: QuorumRabbitmqBroker = make_broker(CommonSettings(amqp_url=AMQP_URL))
    release, started = threading.Event(), threading.Event()
    done: list[int] = []

    def hold(n: int) -> None:
        started.set()
        release.wait(30)
        done.append(n)

    dramatiq.actor(actor_name="hold", queue_name=queue, broker=broker)(hold)
    broker.declare_queue(queue, ensure=True)
    for n in range(MESSAGES):
        broker.enqueue(
            dramatiq.Message(queue_name=queue, actor_name="hold", args=(n,), kwargs={}, options={})
        )
    stop = threading.Event()
    runner = threading.Thread(
        target=run_worker,
        args=(broker,),
        kwargs={
            "name": "prefetch-test",
            "queues": (queue,),
            "threads": 1,
            "metrics_port": 0,
            "ready": lambda: None,
            "stop": stop,
            "prefetch": prefetch,
        },
    )
    runner.start()
    try:
        assert started.wait(15), "the worker never took a message"
        ready = _settle(queue)
    finally:
        release.set()
        deadline = time.monotonic() + 30
        while len(done) < MESSAGES and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        runner.join(40)
    assert sorted(done) == list(range(MESSAGES)), "every message is handled once the actor lets go"
    return ready


def test_a_worker_holds_only_its_threads_worth_of_messages_by_default(queue: str) -> None:
    assert _run(queue, None) == MESSAGES - 1


def test_a_worker_given_a_prefetch_holds_that_many_messages(queue: str) -> None:
    assert _run(queue, 4) == MESSAGES - 4


def test_the_delivery_worker_prefetches_four_wakeups_per_thread_unless_told() -> None:
    assert DeliverySettings.from_env({}).prefetch == 32
    assert DeliverySettings(worker_threads=2).prefetch == 8
    assert DeliverySettings.from_env({"FATURA_DELIVERY_WORKER_THREADS": "3"}).prefetch == 12
    told = {"FATURA_DELIVERY_WORKER_THREADS": "3", "FATURA_DELIVERY_WORKER_PREFETCH": "5"}
    assert DeliverySettings.from_env(told).prefetch == 5
