"""``fatura run kafka-export``: job events to a Kafka topic, for audit and analytics consumers.

Optional and off by default (``FATURA_KAFKA_EXPORT=on``). It follows ``job_events`` on its own
durable cursor (``kafka_export_cursors``), beside the RabbitMQ relay rather than inside it, so a slow
or absent Kafka never holds back the pipeline. Each event is keyed by its job id, so one job's events
share a partition and keep their order there; the producer is idempotent, so a retried send neither
duplicates nor reorders them within a partition.

Events are read as the event feed reads them (``watermark.py``): only a gap-free prefix of
``seq``, so an event that commits late is never skipped. The cursor moves only after the broker
acknowledged every event up to it: a crash in between sends those events again (at least once; a
consumer dedups by the ``seq`` in each event).
"""

from __future__ import annotations

import json
import logging
import random
import signal
import sys
import threading
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from prometheus_client import Counter, Gauge
from psycopg_pool import ConnectionPool

from services.acceptance.kafka.queries import Q
from services.acceptance.kafka.settings import ExportSettings
from services.acceptance.watermark import Watermark
from services.common import readiness
from services.common.db import sync_pool
from services.common.failures import Failure, classify
from services.common.ops_server import start_ops_server

log = logging.getLogger(__name__)

EXPORTED = Counter("fatura_kafka_export_events_total", "Job events the broker acknowledged")
CURSOR = Gauge("fatura_kafka_export_cursor", "Every job event seq up to this one is exported")


def event_value(row: dict[str, Any]) -> bytes:
    return json.dumps(
        {
            "seq": row["seq"],
            "tenant_id": str(row["tenant_id"]),
            "job_id": str(row["job_id"]),
            "state": row["state"],
            "state_version": row["state_version"],
            "kind": row["kind"],
            "at": row["at"].isoformat(),
        },
        separators=(",", ":"),
    ).encode()


class Exporter:
    def __init__(self, settings: ExportSettings, pool: ConnectionPool[Any], producer: Producer) -> None:
        self.settings = settings
        self.pool = pool
        self.producer = producer
        self.watermark: Watermark | None = None

    def export_once(self) -> int:
        """Send the next deliverable events and move the cursor over them; returns how many."""
        s = self.settings
        if self.watermark is None:
            with self.pool.connection() as conn:
                row = conn.execute(Q["export_cursor"], {"name": s.name}).fetchone()
            self.watermark = Watermark(int(row["through"]) if row else 0)
        with self.pool.connection() as conn:
            rows = conn.execute(
                Q["export_poll"], {"after": self.watermark.through, "limit": s.batch_size}
            ).fetchall()
        events = [r for r in rows if r["seq"] is not None]
        before = self.watermark.through
        advance = self.watermark.advance(
            [r["seq"] for r in events], xmin=rows[0]["xmin"], xmax=rows[0]["xmax"], now=time.monotonic()
        )
        if self.watermark.through == before:
            return 0
        errors: list[KafkaError] = []

        def delivered(error: KafkaError | None, _: Message) -> None:
            if error is not None:
                errors.append(error)

        try:
            for event in events[: advance.deliver]:
                self.producer.produce(
                    s.topic,
                    key=str(event["job_id"]).encode(),
                    value=event_value(event),
                    headers=[("fatura-event-seq", str(event["seq"]).encode())],
                    on_delivery=delivered,
                )
            if self.producer.flush(30) > 0 or errors:
                raise KafkaException(errors[0] if errors else "the broker did not acknowledge in time")
            with self.pool.connection() as conn:
                conn.execute(Q["export_advance"], {"name": s.name, "through": self.watermark.through})
        except BaseException:
            self.watermark = None  # read the cursor again: send from where it stands
            raise
        EXPORTED.inc(advance.deliver)
        CURSOR.set(self.watermark.through)
        if advance.skipped:
            log.warning("skipped %d job event numbers no transaction committed in time", advance.skipped)
        return advance.deliver

    def run(self, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            try:
                sent = self.export_once()
                failures = 0
                if sent < self.settings.batch_size:
                    stop.wait(self.settings.poll_seconds)
            except Exception as exc:
                # A dependency blip is weather: back off, read the cursor again, go on.
                failures += 1
                delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                if classify(exc) is Failure.TRANSIENT or isinstance(exc, KafkaException):
                    log.warning("export failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay)
                else:
                    log.exception("export failed unexpectedly; retrying in %.1fs", delay)
                stop.wait(delay)


def main() -> int:
    settings = ExportSettings.from_env()
    if not settings.enabled:
        print(
            "fatura run kafka-export: the export is off; FATURA_KAFKA_EXPORT=on turns it on", file=sys.stderr
        )
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    common = settings.acceptance.common
    producer = Producer(settings.producer_config())
    with sync_pool(common, name="kafka-export", max_size=2, role="relay", db_role="fatura_edge") as pool:
        exporter = Exporter(settings, pool, producer)
        ops = (
            start_ops_server(settings.metrics_port, readiness.postgres(pool))
            if settings.metrics_port
            else None
        )
        log.info(
            "Kafka export %s: job events to %s on %s",
            settings.name,
            settings.topic,
            settings.kafka.bootstrap_servers,
        )
        try:
            exporter.run(stop)
        finally:
            producer.flush(10)
            if ops is not None:
                ops.shutdown()
    return 0
