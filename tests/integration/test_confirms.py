"""Batched publishing with one wait for the confirms (services/common/confirms.py) and the wake-up
publisher built on it (services/common/wakeups.py), against the real RabbitMQ: what it reports taken
is in the queue, what RabbitMQ refused or returned is reported as not taken, and a connection cut
under it fails the batch and the next one reconnects."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import dramatiq
import pika
import pytest
from dramatiq.errors import BrokerConnectionError
from prometheus_client import REGISTRY

from fix_amqp import AMQP_URL, delete_named_queues
from services.chaos.proxy import FaultProxy
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.confirms import ConfirmChannel, Outgoing
from services.common.settings import CommonSettings
from services.common.wakeups import WakeupPublisher


@pytest.fixture
def names() -> Iterator[list[str]]:
    """Queue names of this test (each with Dramatiq's .DQ and .XQ), deleted at its end."""
    created: list[str] = []
    yield created
    delete_named_queues(created)


def _queue(names: list[str]) -> str:
    name = f"test-confirms-{uuid.uuid4().hex[:8]}"
    names.append(name)
    return name


def _broker(url: str = AMQP_URL) -> QuorumRabbitmqBroker:
    return make_broker(CommonSettings.from_env({"FATURA_AMQP_URL": url}))


def _message(queue: str, n: int) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue, actor_name="ingest", args=(n,), kwargs={}, options={})


def _read(queue: str) -> list[dict[str, object]]:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        found = []
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                return found
            found.append({**json.loads(body), "amqp_message_id": properties.message_id})
    finally:
        connection.close()


def test_a_batch_is_taken_whole_and_each_message_is_in_its_queue_once_in_order(names: list[str]) -> None:
    first, second = _queue(names), _queue(names)
    broker = _broker()
    try:
        messages = [_message(first if n % 3 else second, n) for n in range(30)]
        assert broker.publish_all(messages) == [True] * 30
    finally:
        broker.close()
    for queue in (first, second):
        read = _read(queue)
        wanted = [m for m in messages if m.queue_name == queue]
        assert [r["message_id"] for r in read] == [m.message_id for m in wanted]
        assert [r["amqp_message_id"] for r in read] == [m.message_id for m in wanted]
        assert [r["args"] for r in read] == [[m.args[0]] for m in wanted]


def test_a_message_whose_queue_is_gone_is_returned_not_taken_and_its_queue_comes_back(
    names: list[str],
) -> None:
    kept, gone = _queue(names), _queue(names)
    broker = _broker()
    try:
        assert broker.publish_all([_message(kept, 0), _message(gone, 1)]) == [True, True]
        connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
        connection.channel().queue_delete(gone)  # behind the broker's back: it believes it declared
        connection.close()
        assert broker.publish_all([_message(kept, 2), _message(gone, 3), _message(kept, 4)]) == [
            True,
            False,
            True,
        ]
        # The returned message's queue is declared again before the next publish to it.
        assert broker.publish_all([_message(gone, 5)]) == [True]
    finally:
        broker.close()
    assert [r["args"] for r in _read(kept)] == [[0], [2], [4]]
    assert [r["args"] for r in _read(gone)] == [[5]]


def test_messages_a_full_queue_refuses_are_nacked_and_reported_not_taken(names: list[str]) -> None:
    queue = _queue(names)
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        # A classic queue applies its length limit exactly (a quorum queue's takes effect a little
        # after the limit is passed); the confirms are the same.
        arguments = {"x-max-length": 2, "x-overflow": "reject-publish"}
        channel.queue_declare(queue, durable=True, arguments=arguments)
        confirms = ConfirmChannel(connection)
        taken = confirms.publish([Outgoing(queue, f"m{n}".encode(), f"id-{n}") for n in range(5)])
        assert taken == [True, True, False, False, False]
        # The channel goes on: once there is room, the next batch is taken.
        channel.queue_purge(queue)
        assert confirms.publish([Outgoing(queue, b"again", "id-again")]) == [True]
    finally:
        connection.close()


def test_a_connection_cut_under_a_batch_fails_it_and_the_next_batch_reconnects(names: list[str]) -> None:
    queue = _queue(names)
    proxy = FaultProxy("rabbitmq", "127.0.0.1", 5672)
    port = proxy.start()
    broker = _broker(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
    try:
        assert broker.publish_all([_message(queue, 0)]) == [True]
        proxy.cut(30)
        with pytest.raises(BrokerConnectionError):
            broker.publish_all([_message(queue, n) for n in range(1, 4)])
        proxy.restore()
        assert broker.publish_all([_message(queue, n) for n in range(4, 7)]) == [True] * 3
    finally:
        broker.close()
        proxy.close()
    assert [r["args"] for r in _read(queue)] == [[0], [4], [5], [6]]


def _count(queue: str, result: str) -> float:
    value = REGISTRY.get_sample_value("fatura_wakeups_published_total", {"queue": queue, "result": result})
    return value or 0.0


def test_wakeups_handed_over_by_many_threads_each_arrive_once_and_close_sends_what_is_queued(
    names: list[str],
) -> None:
    queue = _queue(names)
    broker = _broker()
    wakeups = WakeupPublisher(broker, "test-wakeups")
    sent = [[_message(queue, t * 100 + n) for n in range(25)] for t in range(8)]
    try:
        threads = [threading.Thread(target=lambda m=m: [wakeups.send([x]) for x in m]) for m in sent]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wakeups.close()  # returns once every queued wake-up was published
    finally:
        broker.close()
    read = _read(queue)
    assert sorted(r["message_id"] for r in read) == sorted(m.message_id for batch in sent for m in batch)
    assert _count(queue, "taken") == 200 and _count(queue, "lost") == 0


def test_wakeups_rabbitmq_cannot_be_reached_for_are_counted_lost_and_later_ones_get_through(
    names: list[str],
) -> None:
    queue = _queue(names)
    proxy = FaultProxy("rabbitmq", "127.0.0.1", 5672)
    port = proxy.start()
    broker = _broker(f"amqp://guest:guest@127.0.0.1:{port}/%2F")
    wakeups = WakeupPublisher(broker, "test-wakeups")
    try:
        wakeups.send([_message(queue, 0)])
        _until(lambda: _count(queue, "taken") == 1)
        proxy.cut(30)
        wakeups.send([_message(queue, 1), _message(queue, 2)])
        _until(lambda: _count(queue, "lost") == 2)
        proxy.restore()
        wakeups.send([_message(queue, 3)])
        _until(lambda: _count(queue, "taken") == 2)
    finally:
        wakeups.close()
        broker.close()
        proxy.close()
    assert [r["args"] for r in _read(queue)] == [[0], [3]]


def _until(condition: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)
