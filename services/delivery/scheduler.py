"""``fatura run delivery-scheduler``: wakes due deliveries, takes back the claims of dead senders, and
re-drives what a lost message would strand.

Retries live in the database: a failed attempt sets ``next_attempt_at``, and this loop sends a
``deliver`` wake-up for each delivery that is due and has not been woken lately (also the safety
net for a wake-up lost between a commit and a publish). A sender that died holding a claim
leaves a lease that runs out; the delivery becomes due again and its lost attempt is logged. A
completion event that the relay published but the delivery inbox never recorded is published
again (the reconciler), and what RabbitMQ dead-lettered is moved into ``dead_letters``.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path
from typing import Any

from services.common import deadletters, events, readiness, reconcile
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import sync_pool
from services.common.failures import Failure, classify
from services.common.ops_server import start_ops_server
from services.common.queries import load_queries
from services.common.reconcile import EventReconciler
from services.common.worker import stop_on_signals
from services.delivery import metrics, payload
from services.delivery.outcomes import MAX_ATTEMPTS
from services.delivery.settings import DeliverySettings
from services.delivery.store import Wake
from services.delivery.worker import deliver_queue, ingest_queue, wakeup_messages

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "delivery.sql")

BATCH = 500
# The unacknowledged count stops here: past it the gauge says "at least this many".
UNACKNOWLEDGED_CAP = 10_000


def tick(pool: Any, broker: QuorumRabbitmqBroker, settings: DeliverySettings) -> int:
    """One pass: expire leases, wake due deliveries, refresh the backlog gauges. Returns wake-ups sent."""
    with pool.connection() as conn, conn.transaction():
        expired = conn.execute(Q["expire_leases"], {"max_attempts": MAX_ATTEMPTS, "limit": BATCH}).fetchall()
    if expired:
        metrics.LEASES_EXPIRED.inc(len(expired))
        log.warning("took back %d deliveries whose sender stopped holding them", len(expired))
    with pool.connection() as conn, conn.transaction():
        due = conn.execute(
            Q["due_wakeups"], {"rewake_seconds": settings.rewake_seconds, "limit": BATCH}
        ).fetchall()
    # Marked woken before publishing: a wake-up RabbitMQ did not take is sent again after
    # rewake_seconds. They leave together, with one wait for their confirms; one endpoint's
    # deliveries share wake-ups, as many to one as a sender's batch takes.
    messages = wakeup_messages(
        settings.common.queue_prefix,
        (Wake(row["delivery_id"], row["endpoint_id"]) for row in due),
        settings.batch_size,
    )
    taken = broker.publish_all(messages)
    woken = sum(len(message.args) for message, ok in zip(messages, taken, strict=True) if ok)
    if woken < len(due):
        log.warning(
            "RabbitMQ did not take the wake-ups of %d of %d deliveries; sent again later",
            len(due) - woken,
            len(due),
        )
    metrics.WAKEUPS.inc(woken)
    rewoken = sum(1 for row in due if row["rewoken"])
    if rewoken:
        reconcile.count("delivery_wakeup", rewoken)
        log.info("woke %d due deliveries again whose earlier wake-up did not lead to an attempt", rewoken)
    with pool.connection() as conn:
        backlog = conn.execute(Q["backlog"]).fetchone()
    if backlog is not None:
        metrics.PENDING.set(backlog["pending"])
        metrics.DUE.set(backlog["due"])
        metrics.OLDEST_DUE_AGE.set(backlog["oldest_due_age_seconds"])
    return len(due)


class Sweeps:
    """The slower duties of a pass: reconcile the inbox, drain dead letters, prune them."""

    def __init__(self, pool: Any, broker: QuorumRabbitmqBroker, settings: DeliverySettings) -> None:
        common = settings.common
        self._pool = pool
        self._broker = broker
        self._settings = settings
        self._queues = [ingest_queue(common.queue_prefix), deliver_queue(common.queue_prefix)]
        self.reconciler = EventReconciler(
            pool,
            broker,
            kind="completion_event",
            queue=self._queues[0],
            actor=events.DELIVERY_INGEST.actor,
            event_types=events.event_types_for(events.DELIVERY_INGEST),
            inbox_table="delivery_inbox",
            grace_seconds=common.reconcile_grace_seconds,
            horizon_seconds=common.reconcile_horizon_seconds,
        )

    def run(self) -> dict[str, int]:
        done = {
            "redriven": self.reconciler.sweep(),
            "dead_lettered": deadletters.drain(self._pool, self._broker, self._queues),
            "redriven_dead_letters": deadletters.publish_requested(self._pool, self._broker, self._queues),
            "pruned": deadletters.prune(self._pool, self._settings.common.dead_letter_retention_days),
        }
        deadletters.refresh_metrics(self._pool, self._queues)
        refresh_unacknowledged(self._pool, self._settings)
        refresh_endpoint_states(self._pool)
        return done


def refresh_endpoint_states(pool: Any) -> dict[str, int]:
    """Set the gauge of endpoints per breaker state; returns the counts."""
    with pool.connection() as conn:
        row = conn.execute(Q["endpoint_states"]).fetchone()
    counts = {state: int(row[state]) if row is not None else 0 for state in ("closed", "open", "disabled")}
    for state, count in counts.items():
        metrics.ENDPOINTS.labels(state).set(count)
    return counts


def refresh_unacknowledged(pool: Any, settings: DeliverySettings) -> int:
    """Set the gauge of deliveries past the acknowledgement window; one bounded query."""
    params = {
        "event_types": list(payload.ACKNOWLEDGEABLE),
        "window_seconds": settings.ack_window_seconds,
        "cap": UNACKNOWLEDGED_CAP,
    }
    with pool.connection() as conn:
        row = conn.execute(Q["unacknowledged"], params).fetchone()
    count = int(row["n"]) if row is not None else 0
    metrics.UNACKNOWLEDGED.set(count)
    return count


def main() -> int:
    settings = DeliverySettings.from_env()
    stop = threading.Event()
    stop_on_signals(stop, "delivery-scheduler")
    broker = make_broker(settings.common)
    with sync_pool(
        settings.common, name="delivery-scheduler", max_size=2, role="scheduler", db_role="fatura_delivery"
    ) as pool:
        ready = readiness.all_of(readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url))
        port = settings.scheduler_metrics_port
        ops = start_ops_server(port, ready) if port else None
        sweeps = Sweeps(pool, broker, settings)
        log.info("delivery scheduler started (every %.2fs)", settings.scheduler_interval_seconds)
        failures = 0
        passes = 0
        try:
            while not stop.is_set():
                try:
                    broker.declare_queue(deliver_queue(settings.common.queue_prefix), ensure=True)
                    sent = tick(pool, broker, settings)
                    # The sweeps read more and matter less often: every fifth pass.
                    if passes % 5 == 0:
                        done = sweeps.run()
                        if any(done.values()):
                            log.info("delivery sweeps: %s", done)
                    passes += 1
                    failures = 0
                except Exception as exc:
                    # The scheduler never exits on a blip: it backs off and tries again.
                    failures += 1
                    delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                    if classify(exc) is Failure.TRANSIENT:
                        log.warning(
                            "scheduler pass failed (%s: %s); retrying in %.1fs",
                            type(exc).__name__,
                            exc,
                            delay,
                        )
                    else:
                        log.exception("scheduler pass failed unexpectedly; retrying in %.1fs", delay)
                    stop.wait(delay)
                    continue
                if sent < BATCH:
                    broker.keep_alive()
                    stop.wait(settings.scheduler_interval_seconds)
        finally:
            if ops is not None:
                ops.shutdown()
            broker.close()
    return 0
