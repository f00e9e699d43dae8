"""``fatura run kafka-ingress``: extraction requests from a Kafka topic, accepted as over HTTP.

Each record is accepted by the HTTP path's ``Acceptor`` (idempotent by tenant + key, the same
admission), and its place in the log, (topic, partition, offset), goes into
``kafka_ingress_inbox`` in the transaction that inserts the job. Only then may its offset be
committed, and only contiguously (``offsets.py``): records run in parallel, but the committed
offset never passes one that is not yet in the inbox. Auto-commit is off.

Nothing blocks the poll loop, so the group's heartbeat and ``max.poll.interval.ms`` hold however
full the pipeline is:

- records wait in a buffer for one of ``max_in_flight`` slots; when it holds twice that many, every
  partition is paused, and resumed when it has drained to half;
- an admission refusal (429 tenant quota, 503 system backlog) pauses the record's partition for the
  refusal's Retry-After and then reads it again from that record: nothing is dropped;
- a transient failure (PostgreSQL away, a broker error) is weather (DESIGN §5.12): the partition
  is paused with backoff and the record read again, never dead-lettered;
- a poison record (malformed, unknown tenant, a reused key) goes to the dead-letter topic with its
  reason in headers, an inbox row records it, and its offset counts as done.

A rebalance commits what is contiguous for the partitions it takes away; records still in flight
there are read again by the new owner, and the inbox (or the idempotency key) makes them no-ops.
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from prometheus_client import Counter, Gauge
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from services.acceptance.accept import Acceptor
from services.acceptance.kafka.dead_letters import send_dead_letter
from services.acceptance.kafka.offsets import OffsetTracker
from services.acceptance.kafka.queries import Q
from services.acceptance.kafka.records import IngressRequest, parse
from services.acceptance.kafka.settings import IngressSettings
from services.acceptance.kafka.tenants import TenantCache
from services.acceptance.requests import RequestParser
from services.common import faults, readiness
from services.common.api.errors import ApiError
from services.common.api.tenancy import Tenant
from services.common.db import async_pool
from services.common.failures import Failure, Poison, classify
from services.common.ops_server import start_ops_server

log = logging.getLogger(__name__)

RECORDS = Counter(
    "fatura_kafka_ingress_records_total", "Kafka records the ingress finished with", ["outcome"]
)
HELD = Counter(
    "fatura_kafka_ingress_held_total", "Records to be read again, and why (admission, transient)", ["reason"]
)
IN_FLIGHT = Gauge("fatura_kafka_ingress_in_flight", "Records being accepted now")
PAUSED = Gauge("fatura_kafka_ingress_paused_partitions", "Partitions paused now")

# Unexpected failures of one record before it is dead-lettered (transient ones are retried forever).
MAX_UNEXPECTED = 5
IDLE_SLEEP = 0.02
Part = tuple[str, int]


@dataclass(frozen=True)
class Hold(Exception):
    """The record is not done; read it again from its offset after ``seconds``."""

    reason: str
    seconds: float


class Ingress:
    def __init__(
        self,
        settings: IngressSettings,
        pool: AsyncConnectionPool[Any],
        consumer: Consumer,
        producer: Producer,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.consumer = consumer
        self.producer = producer
        self.acceptor = Acceptor(pool, None, settings.acceptance)
        self.parser = RequestParser(settings.acceptance)
        self.tenants = TenantCache(pool, settings.acceptance.auth_cache_seconds)
        self.tracker = OffsetTracker()
        self.faults = settings.acceptance.common.faults
        self._owned: set[Part] = set()
        self._paused: set[Part] = set()
        self._hold_until: dict[Part, float] = {}
        self._seek_due: set[Part] = set()
        self._failures: dict[Part, int] = {}
        self._unexpected: dict[tuple[str, int, int], int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._buffer: dict[Part, deque[Message]] = {}
        self._buffered = 0
        self._full = False
        self.problem: str | None = "not yet joined"

    # -- the poll loop ---------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self.consumer.subscribe(
            [self.settings.topic], on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        try:
            while not stop.is_set():
                self._apply_pauses()
                messages = self.consumer.consume(num_messages=self.settings.max_in_flight, timeout=0)
                for message in messages:
                    self._buffer_message(message)
                started = self._start_from_buffers()
                self.producer.poll(0)
                self._commit()
                IN_FLIGHT.set(self.tracker.running)
                PAUSED.set(len(self._paused))
                await asyncio.sleep(0 if messages or started else IDLE_SLEEP)
        finally:
            await self._drain()
            self._commit()
            self.producer.flush(5)
            self.consumer.close()

    async def _drain(self, timeout: float = 10.0) -> None:
        """On the way out: let records in flight finish, so their offsets can be committed."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    def _buffer_message(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("Kafka consumer error: %s", error)
            return
        part = (str(message.topic()), int(message.partition() or 0))
        if part not in self._owned or part in self._seek_due:
            return  # fetched before a revoke, or after a record that is read again
        self._buffer.setdefault(part, deque()).append(message)
        self._buffered += 1

    def _start_from_buffers(self) -> int:
        """Start records while there is room, one partition after another so none waits behind a
        busy one; each partition's records start in offset order."""
        started = 0
        while self.tracker.running < self.settings.max_in_flight and self._buffer:
            for part in list(self._buffer):
                if self.tracker.running >= self.settings.max_in_flight:
                    break
                queue = self._buffer[part]
                while queue:
                    message = queue.popleft()
                    self._buffered -= 1
                    offset = int(message.offset() or 0)
                    # False: in flight already, or done (a redelivery after a seek back).
                    if self.tracker.of(*part).take(offset):
                        task = asyncio.create_task(self._handle(part, offset, message))
                        self._tasks.add(task)
                        task.add_done_callback(self._tasks.discard)
                        started += 1
                        break
                if not queue:
                    del self._buffer[part]
        return started

    def _unbuffer(self, part: Part) -> None:
        self._buffered -= len(self._buffer.pop(part, ()))

    def _apply_pauses(self) -> None:
        """Pause what is held, or everything while the pipeline is full, and resume the rest; a
        partition with a held record is first sought back to the earliest one, to read it again."""
        now = time.monotonic()
        # Records wait in a buffer for a free slot; past twice the slots every partition pauses, and
        # resumes when half of that is left, so a full pipeline keeps polling without fetching.
        room = 2 * self.settings.max_in_flight
        if self._buffered >= room:
            self._full = True
        elif self._buffered <= room // 2:
            self._full = False
        full = self._full
        pause, resume = [], []
        for part in self._owned:
            wait = full or self._hold_until.get(part, 0.0) > now
            if wait and part not in self._paused:
                pause.append(TopicPartition(*part))
                self._paused.add(part)
            elif not wait and part in self._paused:
                resume.append(TopicPartition(*part))
                self._paused.discard(part)
        if pause:
            self.consumer.pause(pause)
        for part in list(self._seek_due):
            if part in self._paused:
                continue
            self._seek_due.discard(part)
            offsets = self.tracker.partitions.get(part)
            lowest = offsets.lowest_held if offsets is not None and part in self._owned else None
            if lowest is not None:
                self._seek(TopicPartition(*part, lowest))
        if resume:
            self.consumer.resume(resume)

    def _seek(self, tp: TopicPartition) -> None:
        try:
            self.consumer.seek(tp)
        except KafkaException as exc:
            # Not fetching yet: the next hold of a record of it tries again.
            log.warning("could not seek %s[%d] to %d: %s", tp.topic, tp.partition, tp.offset, exc)

    def _commit(self, parts: Sequence[Part] | None = None) -> None:
        due = self.tracker.to_commit()
        if parts is not None:
            due = {k: v for k, v in due.items() if k in parts}
        if not due:
            return
        try:
            self.consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in due.items()], asynchronous=False
            )
        except KafkaException as exc:
            log.warning("committing offsets failed (%s); the next pass tries again", exc)
            return
        for (topic, partition), offset in due.items():
            offsets = self.tracker.partitions.get((topic, partition))
            if offsets is not None:
                offsets.committed = offset

    # -- rebalances ------------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.problem = None
        for tp in partitions:
            self._owned.add((tp.topic, tp.partition))
        if partitions:
            log.info("assigned %s", _names(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        parts = [(tp.topic, tp.partition) for tp in partitions]
        self._commit(parts)  # what is contiguous; the rest the next owner reads again
        self._forget(parts)
        if partitions:
            log.info("revoked %s", _names(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget([(tp.topic, tp.partition) for tp in partitions])
        log.warning("lost %s (no commit possible)", _names(partitions))

    def _forget(self, parts: Sequence[Part]) -> None:
        for part in parts:
            self._owned.discard(part)
            self._paused.discard(part)
            self._hold_until.pop(part, None)
            self._seek_due.discard(part)
            self._unbuffer(part)
            self._failures.pop(part, None)
            self.tracker.drop(*part)

    # -- one record ------------------------------------------------------------------------------

    async def _handle(self, part: Part, offset: int, message: Message) -> None:
        try:
            outcome = await self._process(part, offset, message)
            self._failures.pop(part, None)
            self._unexpected.pop((*part, offset), None)
        except Hold as hold:
            HELD.labels(hold.reason).inc()
            self._hold(part, offset, hold.seconds)
            return
        except Exception as exc:
            kind = classify(exc)
            where = (*part, offset)
            count = self._unexpected.get(where, 0) + 1
            if kind is Failure.TRANSIENT or (kind is Failure.UNEXPECTED and count < MAX_UNEXPECTED):
                if kind is Failure.UNEXPECTED:
                    self._unexpected[where] = count
                    log.exception("record %s[%d]@%d failed unexpectedly; reading it again", *where)
                else:
                    log.warning("record %s[%d]@%d: %s: %s; reading it again", *where, type(exc).__name__, exc)
                HELD.labels(kind.value).inc()
                failures = self._failures.get(part, 0) + 1
                self._failures[part] = failures
                self._hold(part, offset, random.uniform(0.1, min(10.0, 0.2 * 2**failures)))
                return
            self._unexpected.pop(where, None)
            try:
                outcome = await self._dead_letter(part, offset, message, Poison("unexpected", repr(exc)))
            except Exception as again:
                log.warning("dead-lettering %s[%d]@%d failed (%s); reading it again", *where, again)
                self._hold(part, offset, 1.0)
                return
        RECORDS.labels(outcome).inc()
        offsets = self.tracker.partitions.get(part)
        if offsets is not None and part in self._owned:
            offsets.finish(offset)

    def _hold(self, part: Part, offset: int, seconds: float) -> None:
        offsets = self.tracker.partitions.get(part)
        if offsets is None or part not in self._owned:
            return  # revoked meanwhile: the new owner reads it from the committed offset
        offsets.hold(offset)
        self._seek_due.add(part)
        self._unbuffer(part)  # read again after the seek back
        until = time.monotonic() + seconds
        self._hold_until[part] = max(self._hold_until.get(part, 0.0), until)

    async def _process(self, part: Part, offset: int, message: Message) -> str:
        """Returns the outcome once the record is durably done; raises ``Hold`` or a failure."""
        where = {"topic": part[0], "partition": part[1], "offset": offset}
        async with self.pool.connection() as conn:
            seen = await (await conn.execute(Q["inbox_seen"], where)).fetchone()
        if seen is not None:
            return "redelivered"
        try:
            request = parse(self.parser, message.key(), message.value())
            tenant = await self.tenants.get(request.tenant_id)
            if tenant is None:
                raise Poison("unknown_tenant", f"there is no tenant {request.tenant_id}")
        except Poison as poison:
            return await self._dead_letter(part, offset, message, poison)
        return await self._accept(where, request, tenant, message, part, offset)

    async def _accept(
        self,
        where: dict[str, Any],
        request: IngressRequest,
        tenant: Tenant,
        message: Message,
        part: Part,
        offset: int,
    ) -> str:
        row = {**where, "tenant_id": request.tenant_id, "idempotency_key": request.idempotency_key}

        async def within(conn: AsyncConnection[Any], job_id: uuid.UUID) -> None:
            await conn.execute(
                Q["inbox_insert"], {**row, "outcome": "accepted", "job_id": job_id, "reason": None}
            )

        try:
            accepted = await self.acceptor.accept(tenant, request.idempotency_key, request.job, within=within)
        except ApiError as exc:
            if exc.status in (429, 503):
                retry_after = float(exc.details.get("retry_after_seconds", 1))
                raise Hold("admission", min(retry_after, self.settings.max_pause_seconds)) from None
            if exc.status == 409 and exc.code == "idempotency_key_in_flight":
                raise Hold("key_in_flight", 0.2) from None
            return await self._dead_letter(part, offset, message, Poison(exc.code, exc.message))
        if accepted.replay:
            # The key's job was accepted before (by HTTP, or by this record before a crash).
            job_id = uuid.UUID(accepted.body["job_id"])
            async with self.pool.connection() as conn, conn.transaction():
                await conn.execute(
                    Q["inbox_insert"], {**row, "outcome": "replayed", "job_id": job_id, "reason": None}
                )
            return "replayed"
        faults.point(self.faults, faults.CRASH_AFTER_INGRESS_INBOX_COMMIT)
        return "accepted"

    async def _dead_letter(self, part: Part, offset: int, message: Message, poison: Poison) -> str:
        """Send the record to the dead-letter topic with its reason, wait for the broker's ack, then
        note it in the inbox so a redelivery does not send it twice."""
        log.warning("record %s[%d]@%d is poison (%s): %s", *part, offset, poison.reason, poison.detail)
        await send_dead_letter(self.producer, self.settings.dead_letter_topic, message, poison)
        async with self.pool.connection() as conn, conn.transaction():
            await conn.execute(
                Q["inbox_insert"],
                {
                    "topic": part[0],
                    "partition": part[1],
                    "offset": offset,
                    "outcome": "dead_lettered",
                    "tenant_id": None,
                    "idempotency_key": None,
                    "job_id": None,
                    "reason": f"{poison.reason}: {poison.detail}"[:2000],
                },
            )
        return "dead_lettered"


def _names(partitions: Sequence[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}[{tp.partition}]" for tp in partitions)


async def _main(settings: IngressSettings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    common = settings.acceptance.common
    pool = async_pool(
        common,
        name="kafka-ingress",
        max_size=max(2, min(settings.max_in_flight, common.db_pool_max)),
        autocommit=True,
        role="worker",
        db_role="fatura_edge",
    )
    consumer = Consumer(settings.consumer_config())
    producer = Producer(settings.producer_config())
    async with pool:
        ingress = Ingress(settings, pool, consumer, producer)
        postgres = readiness.cached(readiness.postgres_connect(common.database_url), 2.0)
        ops = (
            start_ops_server(settings.metrics_port, lambda: postgres() or ingress.problem)
            if settings.metrics_port
            else None
        )
        log.info(
            "Kafka ingress: %s from %s as group %s (%d in flight)",
            settings.topic,
            settings.kafka.bootstrap_servers,
            settings.group_id,
            settings.max_in_flight,
        )
        try:
            await ingress.run(stop)
        finally:
            if ops is not None:
                ops.shutdown()
    return 0


def main() -> int:
    settings = IngressSettings.from_env()
    faults.check(settings.acceptance.common.faults)
    return asyncio.run(_main(settings))
