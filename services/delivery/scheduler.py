"""``fatura run delivery-scheduler``: wakes due deliveries and takes back the claims of dead senders.

Retries live in the database: a failed attempt sets ``next_attempt_at``, and this loop sends a
``deliver`` wake-up for each delivery that is due and has not been woken lately (also the safety
net for a wake-up lost between a commit and a publish). A sender that died holding a claim
leaves a lease that runs out; the delivery becomes due again and its lost attempt is logged.
"""

from __future__ import annotations

import logging
import random
import threading
from pathlib import Path
from typing import Any

import psycopg
from dramatiq.errors import ConnectionError as BrokerConnectionError
from pika.exceptions import AMQPError

from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import sync_pool
from services.common.ops_server import start_ops_server
from services.common.queries import load_queries
from services.common.worker import stop_on_signals
from services.delivery import metrics
from services.delivery.outcomes import MAX_ATTEMPTS
from services.delivery.settings import DeliverySettings
from services.delivery.worker import deliver_message, deliver_queue

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "delivery.sql")

BATCH = 500


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
    # Marked woken before publishing: a publish that fails is retried after rewake_seconds.
    for row in due:
        broker.enqueue(deliver_message(settings.common.queue_prefix, row["delivery_id"]))
    metrics.WAKEUPS.inc(len(due))
    with pool.connection() as conn:
        backlog = conn.execute(Q["backlog"]).fetchone()
    if backlog is not None:
        metrics.PENDING.set(backlog["pending"])
        metrics.OLDEST_DUE_AGE.set(backlog["oldest_due_age_seconds"])
    return len(due)


def main() -> int:
    settings = DeliverySettings.from_env()
    stop = threading.Event()
    stop_on_signals(stop, "delivery-scheduler")
    broker = make_broker(settings.common)
    broker.declare_queue(deliver_queue(settings.common.queue_prefix), ensure=True)
    with sync_pool(settings.common, name="delivery-scheduler", max_size=2) as pool:

        def ready() -> str | None:
            with pool.connection(timeout=2) as conn:
                conn.execute("SELECT 1")
            return None

        port = settings.scheduler_metrics_port
        ops = start_ops_server(port, ready) if port else None
        log.info("delivery scheduler started (every %.2fs)", settings.scheduler_interval_seconds)
        failures = 0
        try:
            while not stop.is_set():
                try:
                    sent = tick(pool, broker, settings)
                    failures = 0
                except (psycopg.Error, BrokerConnectionError, AMQPError) as exc:
                    failures += 1
                    delay = random.uniform(0, min(10.0, 0.2 * 2**failures))
                    log.warning(
                        "scheduler pass failed (%s: %s); retrying in %.1fs", type(exc).__name__, exc, delay
                    )
                    stop.wait(delay)
                    continue
                if sent < BATCH:
                    stop.wait(settings.scheduler_interval_seconds)
        finally:
            if ops is not None:
                ops.shutdown()
            broker.close()
    return 0
