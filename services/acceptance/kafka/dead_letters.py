"""The dead-letter topic of the Kafka ingress: a poison record, as it came, with why.

The record keeps its key, value and headers; headers say the reason (a short code an operator
filters by, as in ``services/common/failures.py``), a detail, and where the record was read.
"""

from __future__ import annotations

import asyncio

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from services.common.failures import Poison

REASON = "fatura-dead-letter-reason"
DETAIL = "fatura-dead-letter-detail"
SOURCE_TOPIC = "fatura-source-topic"
SOURCE_PARTITION = "fatura-source-partition"
SOURCE_OFFSET = "fatura-source-offset"


async def send_dead_letter(producer: Producer, topic: str, message: Message, poison: Poison) -> None:
    """Produce the record to ``topic`` and return once the broker acknowledged it; raises
    ``KafkaException`` when it did not. The caller's poll loop serves the delivery report."""
    loop = asyncio.get_running_loop()
    sent: asyncio.Future[None] = loop.create_future()

    def delivered(error: KafkaError | None, _: Message) -> None:
        loop.call_soon_threadsafe(_settle, sent, None if error is None else KafkaException(error))

    producer.produce(
        topic,
        key=message.key(),
        value=message.value(),
        headers=[
            (REASON, poison.reason.encode()),
            (DETAIL, poison.detail[:1000].encode()),
            (SOURCE_TOPIC, str(message.topic()).encode()),
            (SOURCE_PARTITION, str(message.partition()).encode()),
            (SOURCE_OFFSET, str(message.offset()).encode()),
            *(message.headers() or []),
        ],
        on_delivery=delivered,
    )
    await sent


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
