"""The delivery worker's database side on real PostgreSQL: fenced outcomes, the concurrency cap and
the circuit breaker (deliveries wait, they are not failed)."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from psycopg import sql

from fix_db import MakeTenant, SyncPool
from fix_delivery import KEYRING, insert_secret
from services.common.db import sync_pool
from services.common.queries import load_queries
from services.common.settings import CommonSettings
from services.delivery import outcomes, signing, store
from services.delivery.outcomes import AttemptResult
from services.delivery.settings import DeliverySettings

Q = load_queries(Path(store.__file__).with_name("sql") / "delivery.sql")
SETTINGS = DeliverySettings(
    lease_seconds=30.0, breaker_threshold=2, breaker_cooldown_seconds=60.0, keyring=KEYRING
)


def _endpoint(pool: SyncPool, tenant_id: uuid.UUID, max_concurrency: int = 4) -> uuid.UUID:
    endpoint_id = uuid.uuid4()
    secret = signing.new_secret()
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, max_concurrency)
               VALUES (%s, %s, 'http://127.0.0.1:9/hook', '{extraction.completed.v1}', %s)""",
            (endpoint_id, tenant_id, max_concurrency),
        )
        insert_secret(conn, endpoint_id, secret)
    return endpoint_id


def _delivery(pool: SyncPool, tenant_id: uuid.UUID, endpoint_id: uuid.UUID) -> uuid.UUID:
    event_id = uuid.uuid4()
    delivery_id = signing.delivery_id(event_id, endpoint_id)
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, body)
               VALUES (%s, %s, 'extraction.completed.v1', %s, %s, '{}'::bytea)""",
            (delivery_id, event_id, endpoint_id, tenant_id),
        )
    return delivery_id


def _row(pool: SyncPool, table: str, key: str, value: uuid.UUID) -> dict[str, Any]:
    with pool.connection() as conn:
        query = sql.SQL("SELECT * FROM {} WHERE {} = %s").format(sql.Identifier(table), sql.Identifier(key))
        row = conn.execute(query, (value,)).fetchone()
    assert row is not None
    return dict(row)


@pytest.fixture
def tenant_id(make_tenant: MakeTenant) -> uuid.UUID:
    return make_tenant().id


def test_a_sender_whose_lease_ran_out_cannot_overwrite_the_newer_outcome(
    pool: SyncPool, tenant_id: uuid.UUID
) -> None:
    endpoint_id = _endpoint(pool, tenant_id)
    delivery_id = _delivery(pool, tenant_id, endpoint_id)
    # Given a sender claimed the delivery and stalled past its lease
    stalled = store.claim(pool, delivery_id, replace(SETTINGS, lease_seconds=0.05))
    assert stalled is not None
    time.sleep(0.1)
    with pool.connection() as conn:
        conn.execute(Q["expire_leases"], {"max_attempts": outcomes.MAX_ATTEMPTS, "limit": 10})
    # And another sender took it over and delivered it
    fresh = store.claim(pool, delivery_id, SETTINGS)
    assert fresh is not None and fresh.fence > stalled.fence
    ok = AttemptResult(200)
    assert store.record(pool, fresh, ok, outcomes.decide(ok, fresh.round_attempt), SETTINGS)
    # When the stalled sender finally reports a failure
    late = AttemptResult(503)
    assert not store.record(pool, stalled, late, outcomes.decide(late, stalled.round_attempt), SETTINGS)
    # Then the delivery stays delivered, and the late attempt is logged as stale
    assert _row(pool, "deliveries", "delivery_id", delivery_id)["state"] == "delivered"
    with pool.connection() as conn:
        logged = conn.execute(
            "SELECT outcome FROM delivery_attempts WHERE delivery_id = %s ORDER BY id", (delivery_id,)
        ).fetchall()
    assert [r["outcome"] for r in logged] == ["lost", "delivered", "stale"]


def test_an_endpoint_at_its_concurrency_cap_makes_the_next_delivery_wait(
    pool: SyncPool, tenant_id: uuid.UUID
) -> None:
    endpoint_id = _endpoint(pool, tenant_id, max_concurrency=1)
    first, second = _delivery(pool, tenant_id, endpoint_id), _delivery(pool, tenant_id, endpoint_id)
    assert store.claim(pool, first, SETTINGS) is not None
    assert store.claim(pool, second, SETTINGS) is None
    waiting = _row(pool, "deliveries", "delivery_id", second)
    assert waiting["state"] == "pending" and waiting["attempts"] == 0
    assert "concurrency cap" in waiting["reason"]


def test_consecutive_failures_open_the_breaker_and_later_deliveries_wait_without_an_attempt(
    pool: SyncPool, tenant_id: uuid.UUID
) -> None:
    endpoint_id = _endpoint(pool, tenant_id)
    for _ in range(SETTINGS.breaker_threshold):
        claim = store.claim(pool, _delivery(pool, tenant_id, endpoint_id), SETTINGS)
        assert claim is not None
        failure = AttemptResult(None, "connect_error")
        store.record(pool, claim, failure, outcomes.decide(failure, claim.round_attempt), SETTINGS)
    assert _row(pool, "webhook_endpoints", "id", endpoint_id)["breaker_open_until"] is not None
    later = _delivery(pool, tenant_id, endpoint_id)
    assert store.claim(pool, later, SETTINGS) is None
    waiting = _row(pool, "deliveries", "delivery_id", later)
    assert waiting["state"] == "pending" and waiting["attempts"] == 0
    assert "circuit breaker" in waiting["reason"]
    # A success closes it again
    with pool.connection() as conn:
        conn.execute(Q["endpoint_healthy"], {"endpoint_id": endpoint_id})
    assert _row(pool, "webhook_endpoints", "id", endpoint_id)["breaker_open_until"] is None


def test_concurrent_claims_never_exceed_the_endpoints_cap(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    # Given an endpoint that takes two at a time and twelve due deliveries claimed all at once
    endpoint_id = _endpoint(pool, tenant_id, max_concurrency=2)
    ids = [_delivery(pool, tenant_id, endpoint_id) for _ in range(12)]
    barrier = threading.Barrier(len(ids))
    claims: list[object] = []
    lock = threading.Lock()
    with sync_pool(CommonSettings(database_url=pool.conninfo), name="race", max_size=len(ids)) as race:
        race.wait()

        def claim(delivery_id: uuid.UUID) -> None:
            barrier.wait()
            taken = store.claim(race, delivery_id, SETTINGS)
            with lock:
                claims.append(taken)

        threads = [threading.Thread(target=claim, args=(i,)) for i in ids]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    # Then exactly two were taken; the others wait
    assert sum(c is not None for c in claims) == 2
