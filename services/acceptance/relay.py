"""The outbox relay (DESIGN §2 step 2): committed outbox rows → RabbitMQ, with publisher confirms.

Loop: claim a bounded batch (SKIP LOCKED, with a claim timeout so a crashed relay's claims come
back), publish each event to every queue that consumes it and wait for the broker's confirm, then
set ``published_at``. A crash after a confirm and before that update publishes the event again;
consumers dedup by event id, which is also the message id. No transaction is held open while
publishing. NOTIFY wakes the relay at once; a periodic sweep covers a lost wake-up.

The relay is also acceptance's housekeeper: once a minute it deletes documents no job references
whose retention has passed (``documents.prune_documents``), and every sweep it closes batches whose
last items finished at the same instant, which their own changes could not see
(``batches.close_finished_batches``).
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import dramatiq
import psycopg
from dramatiq.errors import BrokerConnectionError
from prometheus_client import Counter, Gauge
from psycopg_pool import ConnectionPool

from services.acceptance.batches import close_finished_batches
from services.acceptance.documents import prune_documents
from services.acceptance.retention import prune_job_events
from services.acceptance.settings import EventSettings, RelaySettings
from services.common import faults, readiness, tracing
from services.common.broker import QuorumRabbitmqBroker, event_message, make_broker
from services.common.db import connect, sync_pool
from services.common.event_batches import events_message, pack_id
from services.common.events import ROUTES, Route, queue_name
from services.common.failures import Failure, classify
from services.common.ops_server import start_ops_server
from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "relay.sql")

OLDEST_AGE = Gauge(
    "fatura_outbox_oldest_unpublished_age_seconds", "Age of the oldest unpublished outbox event"
)
UNPUBLISHED = Gauge("fatura_outbox_unpublished_events", "Outbox events not yet published")
PUBLISHED = Counter("fatura_outbox_published_total", "Outbox events published and confirmed", ["event_type"])
PUBLISH_FAILURES = Counter("fatura_outbox_publish_failures_total", "Failed publish attempts (event released)")
CLAIMS_RECOVERED = Counter(
    "fatura_outbox_claims_recovered_total", "Events claimed after another relay's claim ran out"
)
UNROUTABLE = Counter("fatura_outbox_unroutable_total", "Events whose type has no consumer route")
DOCUMENTS_PRUNED = Counter(
    "fatura_documents_pruned_total", "Documents no job references, deleted after their retention"
)
JOB_EVENTS_PRUNED = Counter("fatura_job_events_pruned_total", "Job events deleted after their retention")

# After a NOTIFY wakes the relay, the commits right behind it join the same batch, and the NOTIFYs
# queued meanwhile are taken with it: each would otherwise wake a claim that finds nothing.
BATCH_LINGER_SECONDS = 0.01


class Relay:
    def __init__(
        self,
        settings: RelaySettings,
        pool: ConnectionPool[Any],
        broker: QuorumRabbitmqBroker,
        events: EventSettings | None = None,
    ) -> None:
        self.settings = settings
        self.events = events or EventSettings()
        self.pool = pool
        self.broker = broker
        self._last_backlog_check = 0.0
        self._backlog_shown = True  # the gauges may show events not yet published
        self._last_housekeeping = 0.0
        self._last_batch_sweep = 0.0

    def relay_once(self) -> int:
        """Claim, publish and mark one batch. Returns how many events were claimed."""
        s = self.settings
        # The claim is a transaction of its own, the marks another: on the relay's autocommit pool
        # a mark costs one round trip, with no BEGIN and COMMIT. The claim's transaction also keeps
        # its plan an index scan (claim_by_index in relay.sql says why).
        with self.pool.connection() as conn, conn.transaction():
            conn.execute(Q["claim_by_index"])
            rows = conn.execute(
                Q["claim_batch"],
                {"limit": s.batch_size, "claim_seconds": s.claim_timeout_seconds, "relay_id": s.relay_id},
            ).fetchall()
        if not rows:
            return 0
        rows.sort(key=lambda r: r["created_at"])
        # Each queue's share of the batch leaves in messages of up to events_per_message events
        # (services/common/event_batches.py): a message costs RabbitMQ, this process and the
        # consumer far more than an event in it. Every message leaves at once and their confirms
        # are waited for together (QuorumRabbitmqBroker.publish_all): one round trip per batch.
        routed: list[dict[str, Any]] = []
        by_route: dict[Route, list[dict[str, Any]]] = {}
        for row in rows:
            if row["previous_claimer"] is not None:
                CLAIMS_RECOVERED.inc()
            routes = ROUTES.get(row["event_type"])
            if not routes:
                UNROUTABLE.inc()
                log.error(
                    "outbox event %s has type %r, which no consumer takes; it stays unpublished",
                    row["event_id"],
                    row["event_type"],
                )
                # Keep the claim: the event is looked at again only after the claim timeout,
                # instead of on every sweep.
                continue
            routed.append(row)
            for route in routes:
                by_route.setdefault(route, []).append(row)
        messages: list[dramatiq.Message[Any]] = []
        packs: list[list[dict[str, Any]]] = []
        for route, share in by_route.items():
            queue = queue_name(s.common.queue_prefix, route)
            for start in range(0, len(share), s.events_per_message):
                pack = share[start : start + s.events_per_message]
                if len(pack) == 1:
                    message = event_message(queue, route.actor, pack[0]["payload"], str(pack[0]["event_id"]))
                else:
                    ids = [str(row["event_id"]) for row in pack]
                    message = events_message(
                        queue, route.actor, [row["payload"] for row in pack], pack_id(ids)
                    )
                messages.append(message)
                packs.append(pack)
        published: list[uuid.UUID] = []
        unpublished: list[uuid.UUID] = []
        failed = False
        publishing = (
            (
                f"publish {row['event_type']}",
                tracing.valid(row["payload"].get(tracing.TRACEPARENT)),
                {"messaging.message.id": str(row["event_id"]), "job_id": str(row["payload"].get("job_id"))},
            )
            for row in routed
        )
        with tracing.side_by_side(publishing, kind=tracing.SpanKind.PRODUCER):
            try:
                taken = self.broker.publish_all(messages)
            except BrokerConnectionError as exc:
                PUBLISH_FAILURES.inc()
                log.warning("publishing a batch of %d events failed, releasing it: %s", len(routed), exc)
                failed = True
                taken = [False] * len(messages)
        # An event is published once every message carrying it (one per queue) was confirmed.
        refused = {row["event_id"] for pack, ok in zip(packs, taken, strict=True) if not ok for row in pack}
        for row in routed:
            if row["event_id"] not in refused:
                published.append(row["event_id"])
                PUBLISHED.labels(row["event_type"]).inc()
            else:
                if not failed:
                    PUBLISH_FAILURES.inc()
                    log.warning("RabbitMQ did not take event %s; releasing it", row["event_id"])
                failed = True
                unpublished.append(row["event_id"])
        if published:
            faults.point(s.common.faults, faults.CRASH_AFTER_PUBLISH_CONFIRM)
        with self.pool.connection() as conn:
            if published:
                conn.execute(Q["mark_published"], {"event_ids": published})
            if unpublished:
                conn.execute(Q["release_claims"], {"event_ids": unpublished, "relay_id": s.relay_id})
        if failed:
            raise BrokerConnectionError("RabbitMQ did not confirm a publish")  # type: ignore[no-untyped-call]
        return len(rows)

    def update_backlog_metrics(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_backlog_check < 1.0:
            return
        self._last_backlog_check = now
        with self.pool.connection() as conn:
            row = conn.execute(Q["backlog"]).fetchone()
        if row is not None:
            OLDEST_AGE.set(row["oldest_age_seconds"])
            UNPUBLISHED.set(row["unpublished"])
            self._backlog_shown = bool(row["unpublished"])

    def housekeeping(self, *, force: bool = False) -> int:
        """At most once a minute: delete documents no job references, past their retention, and job
        events past theirs. Returns how many documents."""
        now = time.monotonic()
        if not force and now - self._last_housekeeping < 60.0:
            return 0
        self._last_housekeeping = now
        events = prune_job_events(self.pool, self.events.retention_hours * 3600)
        if events:
            JOB_EVENTS_PRUNED.inc(events)
            log.info("deleted %d job events past their retention", events)
        try:
            count, size = prune_documents(self.pool, self.settings.document_retention_days)
        except psycopg.errors.ForeignKeyViolation:
            log.info("a job took up a document being pruned; the next pass tries again")
            return 0
        if count:
            DOCUMENTS_PRUNED.inc(count)
            log.info("deleted %d documents (%d bytes) no job references, past their retention", count, size)
        return count

    def close_batches(self, *, force: bool = False) -> int:
        """At most once per sweep interval: close batches every item of which is final."""
        now = time.monotonic()
        if not force and now - self._last_batch_sweep < self.settings.sweep_interval_seconds:
            return 0
        self._last_batch_sweep = now
        closed = close_finished_batches(self.pool)
        if closed:
            log.info("closed %d batches whose last items finished together", closed)
        return closed

    def run(self, stop: threading.Event) -> None:
        s = self.settings
        listener: psycopg.Connection[Any] | None = None
        failures = 0
        while not stop.is_set():
            try:
                if listener is None or listener.closed:
                    listener = connect(
                        s.common, autocommit=True, role="relay", name="relay-listener", db_role="fatura_relay"
                    )
                    listener.execute(Q["listen"])
                claimed = self.relay_once()
                # An empty claim brings gauges that still show a backlog to zero at once; once they
                # do, an idle wake-up does not count the outbox again.
                self.update_backlog_metrics(force=claimed == 0 and self._backlog_shown)
                self.housekeeping()
                self.close_batches()
                failures = 0
                if claimed >= s.batch_size:
                    continue
                self.broker.keep_alive()
                woken = False
                for _ in listener.notifies(timeout=s.sweep_interval_seconds, stop_after=1):
                    woken = True
                if woken:
                    for _ in listener.notifies(timeout=BATCH_LINGER_SECONDS):
                        pass
            except Exception as exc:
                # Whatever it was, the relay keeps relaying: a dependency blip is weather, and an
                # unexpected error is logged with its traceback and retried after the same backoff.
                failures += 1
                delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                if classify(exc) is Failure.TRANSIENT:
                    log.warning(
                        "relay loop failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay
                    )
                else:
                    log.exception("relay loop failed unexpectedly; retrying in %.1fs", delay)
                if listener is not None:
                    listener.close()
                    listener = None
                stop.wait(delay)
        if listener is not None:
            listener.close()


def main() -> int:
    settings = RelaySettings.from_env()
    faults.check(settings.common.faults)
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        log.info("relay %s: signal %d, finishing the current batch", settings.relay_id, signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    broker = make_broker(settings.common)
    # Autocommit: every statement of the relay's is one transaction by itself, or opens its own.
    with sync_pool(
        settings.common, name="relay", max_size=3, role="relay", autocommit=True, db_role="fatura_relay"
    ) as pool:
        relay = Relay(settings, pool, broker, EventSettings.from_env())
        ready = readiness.all_of(readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url))
        ops = start_ops_server(settings.metrics_port, ready) if settings.metrics_port else None
        log.info("outbox relay %s started (batch %d)", settings.relay_id, settings.batch_size)
        try:
            relay.run(stop)
        finally:
            if ops is not None:
                ops.shutdown()
            broker.close()
    return 0
