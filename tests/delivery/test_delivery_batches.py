"""Batched delivery: one wake-up claims several due deliveries of an endpoint and sends them one after
another, against real PostgreSQL and the reference ERP. Each is still signed, fenced, recorded once
and received once; a batch counts once toward the endpoint's concurrency cap; what a failed batch
did not send is given back without spending an attempt."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest

from fix_db import MakeTenant, SyncPool
from fix_delivery import KEYRING, Erp, insert_secret
from services.common.broker import QuorumRabbitmqBroker
from services.delivery import outcomes, payload, signing, store
from services.delivery.egress import EgressGuard, parse_allow
from services.delivery.outcomes import AttemptResult
from services.delivery.sender import Sender, SendLimits
from services.delivery.settings import DeliverySettings
from services.delivery.worker import DeliveryWorker, TakenInBatches

SETTINGS = DeliverySettings(
    egress_allow=parse_allow(["127.0.0.0/8"]), lease_seconds=30.0, batch_size=4, keyring=KEYRING
)


@pytest.fixture
def tenant_id(make_tenant: MakeTenant) -> uuid.UUID:
    return make_tenant().id


@pytest.fixture
def worker(pool: SyncPool, publisher: QuorumRabbitmqBroker) -> Iterator[DeliveryWorker]:
    sender = Sender(EgressGuard(SETTINGS.egress_allow), SETTINGS.limits)
    worker = DeliveryWorker(SETTINGS, pool, publisher, sender)
    yield worker
    worker.close()
    sender.close()


_MADE: list[uuid.UUID] = []


@pytest.fixture(autouse=True)
def _settle_what_is_left(pool: SyncPool) -> Iterator[None]:
    """Leave no due delivery or live claim behind: a later module's workers (one of them built to
    crash after its first POST) would otherwise send it."""
    yield
    with pool.connection() as conn:
        conn.execute(
            """UPDATE deliveries SET state = 'failed', lease_until = NULL, reason = 'test over'
               WHERE endpoint_id = ANY(%s) AND state IN ('pending', 'delivering')""",
            (_MADE,),
        )
        conn.execute("UPDATE webhook_endpoints SET state = 'disabled' WHERE id = ANY(%s)", (_MADE,))
    _MADE.clear()


def _endpoint(pool: SyncPool, tenant_id: uuid.UUID, url: str, secret: str, max_concurrency: int) -> uuid.UUID:
    """A verified, healthy endpoint (a dirty one is probed one delivery at a time)."""
    endpoint_id = uuid.uuid4()
    _MADE.append(endpoint_id)
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, max_concurrency, verified_at)
               VALUES (%s, %s, %s, '{extraction.completed.v1}', %s, now())""",
            (endpoint_id, tenant_id, url, max_concurrency),
        )
        insert_secret(conn, endpoint_id, secret)
    return endpoint_id


def _deliveries(
    pool: SyncPool, tenant_id: uuid.UUID, endpoint_id: uuid.UUID, n: int
) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """``n`` due deliveries of completed jobs: (delivery_id, job_id), oldest first."""
    made = []
    with pool.connection() as conn:
        for i in range(n):
            event_id, job_id = uuid.uuid4(), uuid.uuid4()
            body = payload.event_body(
                event_id=event_id,
                event_type="extraction.completed.v1",
                tenant_id=tenant_id,
                job_id=job_id,
                state="SUCCEEDED",
                state_version=3,
                occurred_at=datetime.now(UTC),
                job={"state_version": 3, "result": {"total": "1.00"}},
            )
            delivery_id = signing.delivery_id(event_id, endpoint_id)
            conn.execute(
                """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, job_id,
                                           body, next_attempt_at)
                   VALUES (%s, %s, 'extraction.completed.v1', %s, %s, %s, %s,
                           now() - make_interval(secs => %s))""",
                (delivery_id, event_id, endpoint_id, tenant_id, job_id, body, n - i),
            )
            made.append((delivery_id, job_id))
    return made


def _states(pool: SyncPool, ids: list[uuid.UUID]) -> list[tuple[str, int, int]]:
    """(state, attempts, attempt rows) of each delivery, in the order given."""
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT d.delivery_id, d.state, d.attempts,
                      (SELECT count(*) FROM delivery_attempts a WHERE a.delivery_id = d.delivery_id) AS logged
               FROM deliveries d WHERE d.delivery_id = ANY(%s)""",
            (ids,),
        ).fetchall()
    by_id = {r["delivery_id"]: (r["state"], r["attempts"], r["logged"]) for r in rows}
    return [by_id[i] for i in ids]


def test_one_wake_up_sends_a_batch_each_signed_recorded_and_received_once(
    pool: SyncPool, tenant_id: uuid.UUID, erp: Erp, erp_secret: str, worker: DeliveryWorker
) -> None:
    # Given an endpoint that takes one request at a time and five due deliveries to it
    endpoint_id = _endpoint(pool, tenant_id, erp.webhook_url, erp_secret, max_concurrency=1)
    made = _deliveries(pool, tenant_id, endpoint_id, 5)
    ids = [d for d, _ in made]
    # When the oldest one's wake-up is handled
    assert worker.deliver_one(ids[0])
    # Then it and the next three due were sent by that wake-up, each recorded once; the fifth waits
    assert _states(pool, ids) == [("delivered", 1, 1)] * 4 + [("pending", 0, 0)]
    # And the ERP verified the signature of each and applied each once
    for _, job_id in made[:4]:
        entry = erp.ledger(job_id)
        assert entry is not None, job_id
    assert erp.ledger(made[4][1]) is None
    # And the wake-ups of those the batch sent change nothing
    for delivery_id in ids[1:4]:
        assert not worker.deliver_one(delivery_id)
    assert _states(pool, ids[:4]) == [("delivered", 1, 1)] * 4
    # While the last one's own wake-up sends it
    assert worker.deliver_one(ids[4])
    assert _states(pool, ids[4:]) == [("delivered", 1, 1)]
    assert erp.ledger(made[4][1]) is not None


def test_a_batch_counts_once_toward_the_endpoints_concurrency_cap(
    pool: SyncPool, tenant_id: uuid.UUID, erp: Erp, erp_secret: str
) -> None:
    # Given an endpoint that takes one request at a time, and a sender holding a batch of three
    endpoint_id = _endpoint(pool, tenant_id, erp.webhook_url, erp_secret, max_concurrency=1)
    ids = [d for d, _ in _deliveries(pool, tenant_id, endpoint_id, 3)]
    batch = store.claim_batch(pool, ids[0], SETTINGS, limit=4)
    assert [c.delivery_id for c in batch] == ids
    assert len({c.fence for c in batch}) == 1 and all(c.attempt == 1 for c in batch)
    # When another delivery to it comes due
    (later,) = [d for d, _ in _deliveries(pool, tenant_id, endpoint_id, 1)]
    # Then it waits for the one sender, without an attempt
    assert store.claim_batch(pool, later, SETTINGS, limit=4) == []
    assert _states(pool, [later]) == [("pending", 0, 0)]
    # And a second endpoint-cap slot would let a second sender in
    with pool.connection() as conn:
        conn.execute("UPDATE webhook_endpoints SET max_concurrency = 2 WHERE id = %s", (endpoint_id,))
        conn.execute("UPDATE deliveries SET next_attempt_at = now() WHERE delivery_id = %s", (later,))
    assert [c.delivery_id for c in store.claim_batch(pool, later, SETTINGS, limit=4)] == [later]


def test_a_failed_attempt_gives_the_rest_of_its_batch_back_without_spending_attempts(
    pool: SyncPool, tenant_id: uuid.UUID, erp: Erp, erp_secret: str, worker: DeliveryWorker
) -> None:
    # Given three due deliveries to an endpoint whose next answer is a 500
    endpoint_id = _endpoint(pool, tenant_id, erp.webhook_url, erp_secret, max_concurrency=4)
    made = _deliveries(pool, tenant_id, endpoint_id, 3)
    ids = [d for d, _ in made]
    erp.fault("error_500", count=1)
    try:
        # When one wake-up claims them all
        assert worker.deliver_one(ids[0])
    finally:
        erp.clear()
    # Then the first is retried later, the other two are due again with no attempt spent or logged
    assert _states(pool, ids) == [("pending", 1, 1), ("pending", 0, 0), ("pending", 0, 0)]
    with pool.connection() as conn:
        due = conn.execute(
            "SELECT count(*) AS n FROM deliveries WHERE delivery_id = ANY(%s) AND next_attempt_at <= now()",
            (ids[1:],),
        ).fetchone()
    assert due is not None and due["n"] == 2
    # And their next wake-ups are heard (not taken for ones the batch sent): each is delivered
    for delivery_id in ids[1:]:
        assert worker.deliver_one(delivery_id)
    assert _states(pool, ids[1:]) == [("delivered", 1, 1)] * 2
    assert all(erp.ledger(job_id) is not None for _, job_id in made[1:])


def test_attempts_recorded_together_keep_each_claims_fence(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    # Given a batch of two, one of which lost its claim to a newer sender meanwhile
    endpoint_id = _endpoint(pool, tenant_id, "http://127.0.0.1:9/hook", signing.new_secret(), 4)
    ids = [d for d, _ in _deliveries(pool, tenant_id, endpoint_id, 2)]
    batch = store.claim_batch(pool, ids[0], SETTINGS, limit=2)
    assert len(batch) == 2
    with pool.connection() as conn:
        conn.execute("UPDATE deliveries SET fence = fence + 1 WHERE delivery_id = %s", (ids[1],))
    ok = AttemptResult(200)
    attempts = [(c, ok, outcomes.decide(ok, c.round_attempt)) for c in batch]
    # When both attempts are recorded together
    recorded = store.record_many(pool, attempts, SETTINGS)
    # Then only the one still held is delivered; the other's attempt is logged as stale
    assert recorded == 1
    assert [s[0] for s in _states(pool, ids)] == ["delivered", "delivering"]
    with pool.connection() as conn:
        outcome = conn.execute(
            "SELECT outcome FROM delivery_attempts WHERE delivery_id = %s", (ids[1],)
        ).fetchone()
    assert outcome is not None and outcome["outcome"] == "stale"


def test_a_wake_up_is_dropped_only_for_a_delivery_taken_in_a_batch_lately() -> None:
    taken = TakenInBatches()
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    taken.add([a, b], seconds=30.0)
    taken.add([c], seconds=0.01)
    taken.discard([b])
    time.sleep(0.02)
    assert taken.take(a)
    assert not taken.take(a)  # once only: a later wake-up (a resend, a retry) is heard
    assert not taken.take(b)  # given back
    assert not taken.take(c)  # expired
    assert not taken.take(uuid.uuid4())


def test_a_dirty_endpoint_is_sent_one_delivery_at_a_time(
    pool: SyncPool, tenant_id: uuid.UUID, erp: Erp, erp_secret: str
) -> None:
    endpoint_id = _endpoint(pool, tenant_id, erp.webhook_url, erp_secret, max_concurrency=4)
    with pool.connection() as conn:
        conn.execute("UPDATE webhook_endpoints SET consecutive_failures = 2 WHERE id = %s", (endpoint_id,))
    ids = [d for d, _ in _deliveries(pool, tenant_id, endpoint_id, 3)]
    assert [c.delivery_id for c in store.claim_batch(pool, ids[0], SETTINGS, limit=4)] == ids[:1]


class _SlowSender(Sender):
    """The real sender, on a path that takes ``delay`` seconds before each POST (a slow receiver)."""

    def __init__(self, settings: DeliverySettings, delay: float) -> None:
        super().__init__(EgressGuard(settings.egress_allow), settings.limits)
        self.delay = delay

    def post(self, url: str, headers: dict[str, str], body: bytes) -> AttemptResult:
        time.sleep(self.delay)
        return super().post(url, headers, body)


def test_a_batch_to_a_slow_receiver_gives_back_what_it_could_not_start_within_its_window(
    pool: SyncPool, tenant_id: uuid.UUID, erp: Erp, erp_secret: str, publisher: QuorumRabbitmqBroker
) -> None:
    # Given a batch of six whose POSTs may start within 3 x 0.3 s of the claim, to a receiver that
    # takes 0.5 s per request
    settings = replace(SETTINGS, batch_size=6, limits=SendLimits(0.3, 0.3, 0.3))
    assert store.batch_send_window(settings, 6) == pytest.approx(0.9)
    # (so a batch's lease, and a dead sender's delay, is the same for 4 as for 64)
    assert store.batch_lease_seconds(settings, 64) == store.batch_lease_seconds(settings, 4)
    sender = _SlowSender(settings, delay=0.5)
    worker = DeliveryWorker(settings, pool, publisher, sender)
    endpoint_id = _endpoint(pool, tenant_id, erp.webhook_url, erp_secret, max_concurrency=4)
    made = _deliveries(pool, tenant_id, endpoint_id, 6)
    ids = [d for d, _ in made]
    try:
        # When one wake-up claims all six
        assert worker.deliver_one(ids[0])
        # Then it sent what it could start within the window (two, unless a POST took 0.4 s) and
        # gave the rest back: due now, no attempt spent or logged
        states = _states(pool, ids)
        sent = sum(1 for s in states if s == ("delivered", 1, 1))
        assert 1 <= sent <= 2, states
        assert states[sent:] == [("pending", 0, 0)] * (6 - sent), states
        with pool.connection() as conn:
            due = conn.execute(
                """SELECT count(*) AS n FROM deliveries
                   WHERE delivery_id = ANY(%s) AND next_attempt_at <= now()""",
                (ids[sent:],),
            ).fetchone()
        assert due is not None and due["n"] == 6 - sent
        # And their own wake-ups are heard: the next one starts another batch
        assert worker.deliver_one(ids[sent])
        assert _states(pool, ids)[sent] == ("delivered", 1, 1)
    finally:
        worker.close()
        sender.close()
