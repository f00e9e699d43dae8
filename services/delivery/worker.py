"""``fatura run delivery-worker``: the Dramatiq actors ``ingest`` and ``deliver`` (DESIGN §2 step 9).

``ingest`` takes a completion event in (inbox dedup), creates one delivery per matching endpoint
and wakes ``deliver``; the ingest threads' inbox writes share transactions (a group commit).
``deliver`` claims one due delivery under a fence, signs the frozen body, POSTs it through the
egress guard, and records the attempt under that fence. Messages are wake-ups: the database decides
what is sent. The model is never called again for a delivery. A message whose handling failed is
the ``Redelivery`` middleware's to decide (dead letter for a bad one, redelivery with backoff when a
dependency was away).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import dramatiq

from services.common import deadletters, event_batches, events, faults, logs, readiness, tracing
from services.common.broker import QuorumRabbitmqBroker, make_broker
from services.common.db import SyncPool, sync_pool
from services.common.failures import is_transient
from services.common.groupcommit import GroupCommit
from services.common.inbox import Received
from services.common.messages import BadMessage, EventMessage, parse_event
from services.common.wakeups import WakeupPublisher
from services.common.worker import run_worker, stop_on_signals
from services.delivery import metrics, outcomes, signing, store
from services.delivery.egress import EgressGuard
from services.delivery.outcomes import AttemptResult, Decision
from services.delivery.sender import Sender
from services.delivery.settings import DeliverySettings

log = logging.getLogger(__name__)
INGEST_TYPES = events.event_types_for(events.DELIVERY_INGEST)


def ingest_queue(prefix: str) -> str:
    return events.queue_name(prefix, events.DELIVERY_INGEST)


def deliver_queue(prefix: str) -> str:
    return events.queue_name(prefix, events.DELIVERY_DELIVER)


# The most deliveries one wake-up names (FATURA_DELIVERY_BATCH_SIZE's ceiling).
MAX_WAKE_IDS = 64


def deliver_message(prefix: str, *delivery_ids: uuid.UUID) -> dramatiq.Message[Any]:
    """A wake-up for one delivery or, in turn, for several of one endpoint's."""
    return dramatiq.Message(
        queue_name=deliver_queue(prefix),
        actor_name="deliver",
        args=tuple(str(delivery_id) for delivery_id in delivery_ids),
        kwargs={},
        options={},
    )


def wakeup_messages(
    prefix: str, woken: Iterable[store.Wake], per_message: int
) -> list[dramatiq.Message[Any]]:
    """The wake-ups of ``woken``: one per endpoint for up to ``per_message`` of its deliveries (a
    batch's claim takes that many of one endpoint's due deliveries at once, so the others' wake-ups
    would find them taken), never one endpoint's with another's, so a slow receiver delays no other."""
    by_endpoint: dict[uuid.UUID, list[uuid.UUID]] = {}
    for wake in woken:
        by_endpoint.setdefault(wake.endpoint_id, []).append(wake.delivery_id)
    return [
        deliver_message(prefix, *ids[start : start + per_message])
        for ids in by_endpoint.values()
        for start in range(0, len(ids), per_message)
    ]


class TakenInBatches:
    """Deliveries this process claimed in another delivery's batch, whose own wake-up is then
    dropped without a query: the database would answer that there is nothing to do.

    An entry is dropped when its wake-up comes, when the batch gives the delivery back, or when its
    attempt leaves it due again; it also expires (the batch's lease). A wake-up dropped wrongly
    would only wait for the scheduler's re-wake; nothing is sent on the strength of this memo.
    """

    MAX_ENTRIES = 100_000

    def __init__(self) -> None:
        self._until: dict[uuid.UUID, float] = {}
        self._lock = threading.Lock()

    def add(self, delivery_ids: list[uuid.UUID], seconds: float) -> None:
        until = time.monotonic() + seconds
        with self._lock:
            for delivery_id in delivery_ids:
                self._until[delivery_id] = until
            while len(self._until) > self.MAX_ENTRIES:  # oldest first: dicts keep insertion order
                del self._until[next(iter(self._until))]

    def discard(self, delivery_ids: list[uuid.UUID]) -> None:
        with self._lock:
            for delivery_id in delivery_ids:
                self._until.pop(delivery_id, None)

    def take(self, delivery_id: uuid.UUID) -> bool:
        """Whether ``delivery_id`` was taken in a batch lately (forgotten once asked)."""
        with self._lock:
            until = self._until.pop(delivery_id, None)
        return until is not None and until > time.monotonic()


class DeliveryWorker:
    """The two actors' bodies, with what they share (pool, sender, settings)."""

    def __init__(
        self, settings: DeliverySettings, pool: SyncPool, broker: QuorumRabbitmqBroker, sender: Sender
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.broker = broker
        self.sender = sender
        self.taken = TakenInBatches()
        # The ingest threads' inbox writes share transactions (services/common/groupcommit.py).
        self.inbox: GroupCommit[EventMessage, tuple[Received, list[store.Wake]]] = GroupCommit(
            pool, store.take_in, name="delivery_inbox"
        )
        self.wakeups = WakeupPublisher(broker, "delivery-wakeups")
        prefix = settings.common.queue_prefix
        self.ingest_queue = ingest_queue(prefix)
        self.deliver_queue = deliver_queue(prefix)

    def declare(self) -> None:
        # Declared at run time, so the queue names carry this process's prefix.
        ingest = dramatiq.actor(actor_name="ingest", queue_name=self.ingest_queue, broker=self.broker)
        ingest(self.ingest)
        deliver = dramatiq.actor(actor_name="deliver", queue_name=self.deliver_queue, broker=self.broker)
        deliver(self.deliver)

    def ingest(self, event: Any = None, events: Any = None) -> None:
        """One event (``event``) or, from the relay, several (``events``; see
        services/common/event_batches.py), each taken in by itself."""
        several = event_batches.carried(event, events)
        if several is not None:
            self._ingest_all(several)
            return
        message = parse_event(event, INGEST_TYPES)
        with event_batches.consuming(message):
            self._ingest(message)

    def close(self) -> None:
        """Write what the ingest has queued, then stop taking writes, and send the wake-ups still
        queued (the process stops)."""
        self.inbox.close()
        self.wakeups.close()

    def _ingest(self, message: EventMessage) -> None:
        woken = store.to_wake(message, self.inbox.run(message))
        # The deliveries are committed: their wake-ups leave with the other ingest threads' (one
        # confirm round trip for all), and one that is lost is sent by the scheduler after
        # FATURA_DELIVERY_REWAKE_SECONDS.
        self._wake(woken)

    def _wake(self, woken: list[store.Wake]) -> None:
        prefix, per_message = self.settings.common.queue_prefix, self.settings.batch_size
        self.wakeups.send(wakeup_messages(prefix, woken, per_message))

    def _ingest_all(self, several: list[Any]) -> None:
        woken: list[store.Wake] = []

        def taken_in(message: EventMessage, taken: tuple[Received, list[store.Wake]]) -> None:
            with event_batches.consuming(message):
                woken.extend(store.to_wake(message, taken))

        try:
            event_batches.take_all(self.broker, several, INGEST_TYPES, self.inbox.run_many, taken_in)
        finally:
            self._wake(woken)

    def deliver(self, *delivery_ids: Any) -> None:
        """A wake-up: each delivery it names in turn (one endpoint's, see ``wakeup_messages``)."""
        if not 1 <= len(delivery_ids) <= MAX_WAKE_IDS:
            raise BadMessage(
                "malformed", f"a wake-up names 1 to {MAX_WAKE_IDS} deliveries, not {len(delivery_ids)}"
            )
        parsed: list[uuid.UUID] = []
        for delivery_id in delivery_ids:
            try:
                parsed.append(uuid.UUID(str(delivery_id)))
            except ValueError:
                raise BadMessage(
                    "malformed", f"delivery_id is not a UUID: {str(delivery_id)[:64]!r}"
                ) from None
        for one in parsed:
            with logs.bound(delivery_id=one):
                self.deliver_one(one)

    def deliver_one(self, delivery_id: uuid.UUID) -> bool:
        """Attempt the delivery if it is due and its endpoint can take it, with up to
        ``batch_size - 1`` others due to the same endpoint; True when one was attempted.

        The batch is sent one delivery after another over the endpoint's kept-alive connection,
        each started within the batch's send window (what is left when it closes is given back).
        Attempts that leave the endpoint healthy are recorded together at the end, each under its
        own fence; the first one that does not get through is recorded at once and the rest of the
        batch is given back unsent (due again, no attempt spent).
        """
        s = self.settings
        if self.taken.take(delivery_id):
            metrics.WAKEUPS_DROPPED.inc()
            return False
        claims = store.claim_batch(self.pool, delivery_id, s, limit=s.batch_size)
        if not claims:
            return False
        lease = store.batch_lease_seconds(s, len(claims))
        # Each claim's lease started at the claim; recording must end before it does.
        claimed = time.monotonic()
        lease_end = claimed + lease - 1.0
        send_until = claimed + store.batch_send_window(s, len(claims))
        self.taken.add([c.delivery_id for c in claims if c.delivery_id != delivery_id], lease)
        done: list[tuple[store.Claim, AttemptResult, Decision]] = []
        try:
            for i, claim in enumerate(claims):
                if i and time.monotonic() > send_until:
                    # The receiver is slow: the rest would outlive the lease. Given back, due now.
                    self.taken.discard([c.delivery_id for c in claims[i:]])
                    store.release_unsent(self.pool, claims[i:])
                    metrics.BATCH_GIVEN_BACK.inc(len(claims) - i)
                    break
                result, decision = self._attempt(claim)
                if store.touches_endpoint(claim, decision):
                    self._record(lease_end, claim, result, decision)
                else:
                    done.append((claim, result, decision))
                if decision.state != "delivered":
                    # Due again (now, or after its retry delay): its next wake-up must be heard.
                    self.taken.discard([c.delivery_id for c in claims[i:]])
                    store.release_unsent(self.pool, claims[i + 1 :])
                    break
        finally:
            if done:
                self._record_many(lease_end, done)
        return True

    def _attempt(self, claim: store.Claim) -> tuple[AttemptResult, Decision]:
        """Sign and POST one claimed delivery; what happened and what it means."""
        s = self.settings
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
            if result.status is not None:
                # The receiver answered: dying now leaves a webhook it has, unrecorded here.
                faults.point(s.common.faults, faults.CRASH_AFTER_WEBHOOK_POST)
            decision = outcomes.decide(result, claim.round_attempt, scale=s.retry_scale)
            if result.status is not None:
                span.set_attribute("http.response.status_code", result.status)
            span.set_attribute("delivery.outcome", decision.state)
            log.info(
                "delivery %s attempt %d: %s (%s)", msg_id, claim.attempt, decision.state, decision.reason
            )
        return result, decision

    def _record(
        self, lease_end: float, claim: store.Claim, result: AttemptResult, decision: Decision
    ) -> None:
        """Record the attempt, waiting out a database blip while the claim's lease lasts: the POST
        was made, and an unrecorded attempt would be sent again after the lease."""
        self._while_leased(lease_end, lambda: store.record(self.pool, claim, result, decision, self.settings))

    def _record_many(self, lease_end: float, done: list[tuple[store.Claim, AttemptResult, Decision]]) -> None:
        self._while_leased(lease_end, lambda: store.record_many(self.pool, done, self.settings))

    def _while_leased(self, lease_end: float, write: Callable[[], object]) -> None:
        delay = 0.2
        while True:
            try:
                write()
                return
            except Exception as exc:
                if not is_transient(exc) or time.monotonic() + delay >= lease_end:
                    raise
                log.warning("recording delivery attempts failed (%s); retrying", exc)
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

        def on_stop() -> None:
            worker.close()
            sender.close()

        return run_worker(
            broker,
            name="delivery-worker",
            queues=(worker.ingest_queue, worker.deliver_queue),
            threads=settings.worker_threads,
            prefetch=settings.prefetch,
            metrics_port=settings.worker_metrics_port,
            ready=ready,
            stop=stop,
            on_stop=on_stop,
        )
