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


def _rows_examined(node: dict[str, Any]) -> int:
    """Rows a plan node and every node under it produced or threw away, over all their loops."""
    removed = sum(int(node.get(key, 0)) for key in node if str(key).startswith("Rows Removed by"))
    own = (int(node["Actual Rows"]) + removed) * int(node.get("Actual Loops", 1))
    return own + sum(_rows_examined(child) for child in node.get("Plans", []))


def _backlog(pool: SyncPool, tenant_id: uuid.UUID, *, analyze_after: bool) -> tuple[uuid.UUID, uuid.UUID]:
    """An endpoint with 4,000 due deliveries (its ERP was away, or a burst came in); returns it and
    one of its deliveries. The planner's statistics are taken before the backlog was written (as
    during a burst) or after it."""
    endpoint_id = _endpoint(pool, tenant_id, 8)
    with pool.connection() as conn:
        conn.execute("ANALYZE deliveries")
        conn.execute(
            """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, body)
               SELECT gen_random_uuid(), gen_random_uuid(), 'extraction.completed.v1', %s, %s, '{}'::bytea
               FROM generate_series(1, 4000)""",
            (endpoint_id, tenant_id),
        )
        if analyze_after:
            conn.execute("ANALYZE deliveries")
        conn.commit()
    return endpoint_id, _delivery(pool, tenant_id, endpoint_id)


@pytest.mark.parametrize("statistics", ["fresh", "from before the backlog"])
def test_a_batch_claim_reads_about_the_deliveries_it_takes_not_every_due_one(
    pool: SyncPool, tenant_id: uuid.UUID, statistics: str
) -> None:
    with pool.connection() as conn:
        conn.execute("ALTER TABLE deliveries SET (autovacuum_enabled = false)")  # statistics as set here
    try:
        # Given an endpoint with 4,000 due deliveries
        endpoint_id, woken = _backlog(pool, tenant_id, analyze_after=statistics == "fresh")
        # When a wake-up claims a batch of four under the endpoint's lock (rolled back after)
        with pool.connection() as conn:
            params = {"delivery_id": woken, "endpoint_id": endpoint_id, "more": 3, "lease_seconds": 60.0}
            row = conn.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + Q["claim"], params).fetchone()
            conn.rollback()
        assert row is not None
        plan = next(iter(row.values()))[0]["Plan"]
        # Then it took four; with fresh statistics it looked at a small part of the backlog (64 rows
        # in one run, 20 in another: the plan depends on the rest of the table), and with stale ones
        # a few times the backlog at most (it used to re-read the backlog for each row)
        assert plan["Actual Rows"] == 4
        examined = _rows_examined(plan)
        assert examined <= (4001 // 10 if statistics == "fresh" else 5 * 4001), examined
    finally:
        with pool.connection() as conn:
            conn.execute("DELETE FROM deliveries WHERE tenant_id = %s", (tenant_id,))
            conn.execute("ALTER TABLE deliveries RESET (autovacuum_enabled)")
