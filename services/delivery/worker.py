"""``fatura run delivery-worker``: the Dramatiq actors ``ingest`` and ``deliver`` (DESIGN §2 step 9).

``ingest`` takes a completion event in (inbox dedup), creates one delivery per matching endpoint
and wakes ``deliver``. ``deliver`` claims one due delivery under a fence, signs the frozen body,
POSTs it through the egress guard, and records the attempt under that fence. Messages are
wake-ups: the database decides what is sent. The model is never called again for a delivery.
A message whose handling failed is the ``Redelivery`` middleware's to decide (dead letter for a bad
one, redelivery with backoff when a dependency was away).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from functools import partial
from typing import Any

import dramatiq
from dramatiq.errors import BrokerConnectionError

from services.common import deadletters, events, faults, logs, readiness, tracing
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import SyncPool, sync_pool
from services.common.failures import is_transient
from services.common.messages import BadMessage, EventMessage, parse_event
from services.common.worker import run_worker, stop_on_signals
from services.delivery import metrics, outcomes, signing, store
from services.delivery.egress import EgressGuard
from services.delivery.outcomes import AttemptResult, Decision
from services.delivery.sender import Sender
from services.delivery.settings import DeliverySettings

log = logging.getLogger(__name__)


def ingest_queue(prefix: str) -> str:
    return events.queue_name(prefix, events.DELIVERY_INGEST)


def deliver_queue(prefix: str) -> str:
    return events.queue_name(prefix, events.DELIVERY_DELIVER)


def deliver_message(prefix: str, delivery_id: uuid.UUID) -> dramatiq.Message[Any]:
    return dramatiq.Message(
        queue_name=deliver_queue(prefix),
        actor_name="deliver",
        args=(str(delivery_id),),
        kwargs={},
        options={},
    )


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
        message = parse_event(event, events.event_types_for(events.DELIVERY_INGEST))
        with (
            tracing.span(
                f"ingest {message.event_type}",
                message.traceparent,
                {"messaging.message.id": str(message.event_id), "job_id": str(message.job_id)},
                kind=tracing.SpanKind.CONSUMER,
            ),
            logs.bound(job_id=message.job_id, tenant_id=message.tenant_id),
        ):
            self._ingest(message)

    def _ingest(self, message: EventMessage) -> None:
        woken = store.ingest(self.pool, message)
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
            raise BadMessage("malformed", f"delivery_id is not a UUID: {str(delivery_id)[:64]!r}") from None
        with logs.bound(delivery_id=parsed):
            self.deliver_one(parsed)

    def deliver_one(self, delivery_id: uuid.UUID) -> bool:
        """Attempt one delivery if it is due and its endpoint can take it; True when attempted."""
        s = self.settings
        claim = store.claim(self.pool, delivery_id, s)
        if claim is None:
            return False
        msg_id = str(claim.delivery_id)
        attributes: dict[str, str | int] = {"delivery_id": msg_id, "attempt": claim.attempt}
        attributes["fence"] = claim.fence
        with (
            tracing.span(
                "webhook attempt", claim.traceparent, attributes, kind=tracing.SpanKind.CLIENT
            ) as span,
            logs.bound(delivery_id=msg_id, attempt=claim.attempt, fence=claim.fence),
        ):
            headers = signing.headers(claim.secrets, msg_id, int(time.time()), claim.body)
            traceparent = tracing.current_traceparent()
            if traceparent is not None:
                # The receiver may continue the trace; the signature covers the body, not this.
                headers[tracing.TRACEPARENT] = traceparent
            result = self.sender.post(claim.url, headers, claim.body)
            metrics.POST_SECONDS.observe(result.latency_ms / 1000)
            faults.point(s.common.faults, faults.CRASH_AFTER_WEBHOOK_POST)
            decision = outcomes.decide(result, claim.round_attempt, scale=s.retry_scale)
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            span.set_attribute("delivery.outcome", decision.state)
            self._record(claim, result, decision)
            log.info(
                "delivery %s attempt %d: %s (%s)", msg_id, claim.attempt, decision.state, decision.reason
            )
        return True

    def _record(self, claim: store.Claim, result: AttemptResult, decision: Decision) -> None:
        """Record the attempt, waiting out a database blip while the claim's lease lasts: the POST
        was made, and an unrecorded attempt would be sent again after the lease."""
        # The claim was taken just before the POST; its lease runs out about this much later.
        lease_end = time.monotonic() + self.settings.lease_seconds - (result.latency_ms or 0) / 1000 - 1.0
        delay = 0.2
        while True:
            try:
                store.record(self.pool, claim, result, decision, self.settings)
                return
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() + delay >= lease_end:
                    raise
                log.warning(
                    "delivery %s: recording its attempt failed (%s); retrying", claim.delivery_id, exc
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)


def main() -> int:
    settings = DeliverySettings.from_env()
    faults.check(settings.common.faults)
    if settings.require_keyring("the delivery worker").is_development:
        log.warning("webhook secrets are sealed under the public development key: set FATURA_SECRETS_KEY")
    stop = threading.Event()
    stop_on_signals(stop, "delivery-worker")
    broker = make_broker(settings.common)
    sender = Sender(EgressGuard(settings.egress_allow), settings.limits)
    pool_size = settings.worker_threads + 2
    # Autocommit: a single-statement write is one round trip; multi-statement steps open their own
    # transaction.
    with sync_pool(
        settings.common,
        name="delivery-worker",
        max_size=pool_size,
        role="worker",
        autocommit=True,
        db_role="fatura_delivery",
    ) as pool:
        broker.redelivery.dead_letter = partial(deadletters.record, pool)
        worker = DeliveryWorker(settings, pool, broker, sender)
        worker.declare()
        ready = readiness.all_of(readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url))

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
