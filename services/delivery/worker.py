"""``fatura run delivery-worker``: the Dramatiq actors ``ingest`` and ``deliver`` (DESIGN §2 step 9).

``ingest`` takes a completion event in (inbox dedup), creates one delivery per matching endpoint
and wakes ``deliver``. ``deliver`` claims one due delivery under a fence, signs the frozen body,
POSTs it through the egress guard, and records the attempt under that fence. Messages are
wake-ups: the database decides what is sent. The model is never called again for a delivery.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import dramatiq
from dramatiq.errors import ConnectionError as BrokerConnectionError
from dramatiq.middleware import CurrentMessage

from services.common import faults
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import SyncPool
from services.common.messages import BadMessage, parse_event, reject
from services.common.worker import run_worker, stop_on_signals
from services.delivery import metrics, outcomes, payload, signing, store
from services.delivery.egress import EgressGuard
from services.delivery.sender import Sender
from services.delivery.settings import DeliverySettings
from services.delivery.store import autocommit_pool

log = logging.getLogger(__name__)


def ingest_queue(prefix: str) -> str:
    return f"{prefix}.delivery.ingest"


def deliver_queue(prefix: str) -> str:
    return f"{prefix}.delivery.deliver"


def deliver_message(prefix: str, delivery_id: uuid.UUID) -> dramatiq.Message[Any]:
    return dramatiq.Message(
        queue_name=deliver_queue(prefix),
        actor_name="deliver",
        args=(str(delivery_id),),
        kwargs={},
        options={},
    )


def _message_id() -> str | None:
    message = CurrentMessage.get_current_message()
    return None if message is None else str(message.message_id)


class DeliveryWorker:
    """The two actors' bodies, with what they share (pool, sender, settings)."""

    def __init__(
        self, settings: DeliverySettings, pool: SyncPool, broker: QuorumRabbitmqBroker, sender: Sender
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.broker = broker
        self.sender = sender
        prefix = settings.common.queue_prefix
        self.ingest_queue = ingest_queue(prefix)
        self.deliver_queue = deliver_queue(prefix)

    def declare(self) -> None:
        # Declared at run time, so the queue names carry this process's prefix.
        ingest = dramatiq.actor(actor_name="ingest", queue_name=self.ingest_queue, broker=self.broker)
        ingest(self.ingest)
        deliver = dramatiq.actor(actor_name="deliver", queue_name=self.deliver_queue, broker=self.broker)
        deliver(self.deliver)

    def ingest(self, event: Any = None) -> None:
        try:
            message = parse_event(event, payload.EVENT_TYPES)
            woken = store.ingest(self.pool, message)
        except BadMessage as exc:
            reject(self.pool, self.ingest_queue, "ingest", _message_id(), exc, event)
            raise
        try:
            for delivery_id in woken:
                self.broker.enqueue(deliver_message(self.settings.common.queue_prefix, delivery_id))
        except BrokerConnectionError as exc:
            # The deliveries are committed; the scheduler wakes them after FATURA_DELIVERY_REWAKE_SECONDS.
            log.warning("could not wake deliver for event %s (%s); the scheduler will", message.event_id, exc)

    def deliver(self, delivery_id: Any = None) -> None:
        try:
            parsed = uuid.UUID(str(delivery_id))
        except ValueError:
            error = BadMessage("malformed", f"delivery_id is not a UUID: {str(delivery_id)[:64]!r}")
            reject(self.pool, self.deliver_queue, "deliver", _message_id(), error, delivery_id)
            raise error from None
        self.deliver_one(parsed)

    def deliver_one(self, delivery_id: uuid.UUID) -> bool:
        """Attempt one delivery if it is due and its endpoint can take it; True when attempted."""
        s = self.settings
        claim = store.claim(self.pool, delivery_id, s)
        if claim is None:
            return False
        msg_id = str(claim.delivery_id)
        headers = signing.headers(claim.secrets, msg_id, int(time.time()), claim.body)
        result = self.sender.post(claim.url, headers, claim.body)
        metrics.POST_SECONDS.observe(result.latency_ms / 1000)
        faults.point(s.common.faults, faults.CRASH_AFTER_WEBHOOK_POST)
        decision = outcomes.decide(result, claim.round_attempt, scale=s.retry_scale)
        store.record(self.pool, claim, result, decision, s)
        log.info("delivery %s attempt %d: %s (%s)", msg_id, claim.attempt, decision.state, decision.reason)
        return True


def main() -> int:
    settings = DeliverySettings.from_env()
    faults.check(settings.common.faults)
    stop = threading.Event()
    stop_on_signals(stop, "delivery-worker")
    broker = make_broker(settings.common)
    sender = Sender(EgressGuard(settings.egress_allow), settings.limits)
    pool_size = settings.worker_threads + 2
    with autocommit_pool(settings.common, name="delivery-worker", max_size=pool_size) as pool:
        worker = DeliveryWorker(settings, pool, broker, sender)
        worker.declare()

        def ready() -> str | None:
            with pool.connection(timeout=2) as conn:
                conn.execute("SELECT 1")
            return None

        return run_worker(
            broker,
            name="delivery-worker",
            queues=(worker.ingest_queue, worker.deliver_queue),
            threads=settings.worker_threads,
            metrics_port=settings.worker_metrics_port,
            ready=ready,
            stop=stop,
            on_stop=sender.close,
        )
