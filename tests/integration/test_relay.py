"""The outbox relay against real RabbitMQ: confirms, crash recovery, two relays at once."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator

import httpx
import pytest

from fix_amqp import Delivered, QueueReader
from fix_api import SubmitFn
from fix_db import SyncPool, TenantHandle, buffers_touched, database_of_its_own
from fix_processes import ServiceProcess, SpawnFn
from services.acceptance.relay import Q as RELAY_Q
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.procs import free_port

StartRelay = Callable[..., ServiceProcess]


@pytest.fixture
def start_relay(spawn: SpawnFn) -> Iterator[StartRelay]:
    started: list[ServiceProcess] = []

    def start(**env: str) -> ServiceProcess:
        port = free_port()
        relay = spawn(
            "relay",
            FATURA_RELAY_METRICS_PORT=str(port),
            FATURA_RELAY_SWEEP_SECONDS="0.2",
            FATURA_RELAY_ID=f"relay-{len(started)}",
            **env,
        )
        relay.base_url = f"http://127.0.0.1:{port}"
        started.append(relay)
        if "FATURA_FAULTS" not in env:
            relay.wait_ready(f"{relay.base_url}/readyz")
        return relay

    yield start
    for relay in started:
        if relay.alive():
            assert relay.stop() == 0, relay.log()


def _event_ids(pool: SyncPool, tenant: TenantHandle) -> set[str]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT event_id FROM outbox_events WHERE tenant_id = %s", (tenant.id,)
        ).fetchall()
    return {str(r["event_id"]) for r in rows}


def _wait_published(pool: SyncPool, tenant: TenantHandle, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with pool.connection() as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE published_at IS NULL) AS left"
                " FROM outbox_events WHERE tenant_id = %s",
                (tenant.id,),
            ).fetchone()
        if row is not None and row["left"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("the relay did not publish every event in time")


def _submit_many(client: httpx.Client, tenant: TenantHandle, count: int, key: str) -> None:
    for i in range(count):
        reply = client.post(
            "/v1/extraction-jobs",
            json={"document": {"text": f"invoice {i}"}},
            headers={**tenant.headers, "Idempotency-Key": f"{key}-{i}"},
        )
        assert reply.status_code == 202


def _ours(messages: list[Delivered], ids: set[str]) -> list[Delivered]:
    return [m for m in messages if m.event_id in ids]


def test_the_relay_publishes_each_committed_event_and_then_marks_it(
    start_relay: StartRelay,
    submit: SubmitFn,
    tenant: TenantHandle,
    pool: SyncPool,
    inference_queue: QueueReader,
) -> None:
    relay = start_relay()
    job_id = submit(tenant).json()["job_id"]

    _wait_published(pool, tenant)

    ids = _event_ids(pool, tenant)
    delivered = _ours(inference_queue.drain(), ids)
    assert [m.event_id for m in delivered] == list(ids)
    message = delivered[0]
    assert message.actor_name == "ingest"
    assert message.event["job_id"] == job_id
    assert message.event["event_type"] == "extraction.requested.v1"
    assert set(message.event) == {"event_id", "event_type", "tenant_id", "job_id", "state", "state_version"}
    metrics = httpx.get(f"{relay.base_url}/metrics").text
    assert "fatura_outbox_oldest_unpublished_age_seconds" in metrics
    assert 'fatura_outbox_published_total{event_type="extraction.requested.v1"}' in metrics


def test_a_relay_killed_between_confirm_and_published_at_publishes_again_and_loses_nothing(
    start_relay: StartRelay,
    submit: SubmitFn,
    tenant: TenantHandle,
    pool: SyncPool,
    inference_queue: QueueReader,
) -> None:
    """Given a relay that dies right after RabbitMQ confirms, when another relay runs after the claim
    timeout, then the event is published a second time (a duplicate the consumer dedups), never lost."""
    crashing = start_relay(
        FATURA_FAULTS="crash_after_publish_confirm", FATURA_RELAY_CLAIM_TIMEOUT_SECONDS="1"
    )
    submit(tenant)
    assert crashing.wait_exit(timeout=30) == -9, crashing.log()
    ids = _event_ids(pool, tenant)
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT published_at, claimed_by FROM outbox_events WHERE tenant_id = %s", (tenant.id,)
        ).fetchone()
    assert row is not None and row["published_at"] is None and row["claimed_by"] == "relay-0"
    first_copy = _ours(inference_queue.drain(), ids)
    assert [m.event_id for m in first_copy] == list(ids)

    start_relay(FATURA_RELAY_CLAIM_TIMEOUT_SECONDS="1")
    _wait_published(pool, tenant)

    second_copy = _ours(inference_queue.drain(), ids)
    assert [m.event_id for m in second_copy] == list(ids)
    assert second_copy[0].event == first_copy[0].event
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT publish_attempts, claimed_by FROM outbox_events WHERE tenant_id = %s", (tenant.id,)
        ).fetchone()
    assert row is not None and row["publish_attempts"] == 2 and row["claimed_by"] == "relay-1"


def test_two_relays_at_once_publish_every_event_exactly_once(
    start_relay: StartRelay,
    client: httpx.Client,
    tenant: TenantHandle,
    pool: SyncPool,
    inference_queue: QueueReader,
) -> None:
    start_relay(FATURA_RELAY_BATCH_SIZE="7")
    start_relay(FATURA_RELAY_BATCH_SIZE="7")
    _submit_many(client, tenant, 150, "two-relays")

    _wait_published(pool, tenant)

    ids = _event_ids(pool, tenant)
    assert len(ids) == 150
    delivered = _ours(inference_queue.drain(), ids)
    counts = Counter(m.event_id for m in delivered)
    assert set(counts) == ids
    assert max(counts.values()) == 1


@pytest.mark.parametrize(("per_message", "sizes"), [("16", [16, 16, 8]), ("1", [1] * 40)])
def test_a_batch_leaves_in_messages_of_at_most_events_per_message_each_event_once(
    start_relay: StartRelay,
    client: httpx.Client,
    tenant: TenantHandle,
    pool: SyncPool,
    inference_queue: QueueReader,
    per_message: str,
    sizes: list[int],
) -> None:
    # Given 40 committed events before any relay runs (so one claim takes them all)
    _submit_many(client, tenant, 40, f"packed-{per_message}")
    # When a relay publishes them
    start_relay(FATURA_RELAY_EVENTS_PER_MESSAGE=per_message)
    _wait_published(pool, tenant)
    # Then each arrives once, in messages of at most that many events
    ids = _event_ids(pool, tenant)
    delivered = _ours(inference_queue.drain(), ids)
    assert Counter(m.event_id for m in delivered) == Counter(ids)
    by_message = Counter(m.message_id for m in delivered)
    assert sorted(by_message.values(), reverse=True) == sizes
    for m in delivered:
        alone = m.message_id == m.event_id
        assert ("event" in m.raw["kwargs"]) is alone and ("events" in m.raw["kwargs"]) is not alone


def test_an_event_type_nobody_consumes_is_never_marked_published(
    start_relay: StartRelay, submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    job_id = uuid.UUID(submit(tenant).json()["job_id"])
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO outbox_events (event_id, tenant_id, job_id, event_type, payload)
               VALUES (%s, %s, %s, 'extraction.mystery.v1', '{}')""",
            (uuid.uuid4(), tenant.id, job_id),
        )
    relay = start_relay()
    time.sleep(1.5)
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT event_type, published_at IS NOT NULL AS published"
            " FROM outbox_events WHERE tenant_id = %s",
            (tenant.id,),
        ).fetchall()
    assert {r["event_type"]: r["published"] for r in rows} == {
        "extraction.requested.v1": True,
        "extraction.mystery.v1": False,
    }
    assert "fatura_outbox_unroutable_total 1.0" in httpx.get(f"{relay.base_url}/metrics").text
    with pool.connection() as conn:  # leave no poison behind for later tests
        conn.execute("DELETE FROM outbox_events WHERE event_type = 'extraction.mystery.v1'")


@pytest.fixture
def quiet_pool(database_url: str) -> Iterator[SyncPool]:
    """A database of its own: no other test's session or process there can hold a snapshot from
    before an update, so the index entries the update left dead can be marked as such."""
    with database_of_its_own(database_url, "deadidx") as (_, quiet):
        yield quiet


def _wait_for_no_older_snapshot(pool: SyncPool, xid: int, timeout: float = 60.0) -> None:
    """Until no session holds back what a scan may mark dead among the rows ``xid`` updated: no other
    session of this database with a snapshot or a transaction from before ``xid`` (autovacuum's
    ANALYZE may, for a moment), and no session of *any* database with a transaction id from before
    it. A transaction still running anywhere is in every new snapshot's list of running ones, so it
    holds back this session's own snapshot, and with it what its scan may treat as dead: one such
    transaction in another database (another test's, on the other xdist worker) made CI fail with
    (349, 352)."""
    deadline = time.monotonic() + timeout
    holders: list[dict[str, object]] = []
    while time.monotonic() < deadline:
        with pool.connection() as conn:
            holders = conn.execute(
                """SELECT pid, datname, backend_type, application_name, state, left(query, 120) AS query
                   FROM pg_stat_activity
                   WHERE pid <> pg_backend_pid()
                     AND (age(backend_xid) >= age((%(xid)s %% 4294967296)::text::xid)
                          OR (datname = current_database()
                              AND age(backend_xmin) >= age((%(xid)s %% 4294967296)::text::xid)))""",
                {"xid": xid},
            ).fetchall()
        if not holders:
            return
        time.sleep(0.2)
    pytest.fail(
        f"sessions still hold snapshots or transactions from before the update after {timeout:.0f} s: "
        f"{holders}"
    )


def _claim_blocks(pool: SyncPool, first_statement: str) -> int:
    params = {"limit": 200, "claim_seconds": 30, "relay_id": "plan-test"}
    return buffers_touched(pool, RELAY_Q["claim_batch"], params, after=first_statement)


def test_a_claim_steps_over_events_published_since_instead_of_visiting_each_of_them(
    quiet_pool: SyncPool,
) -> None:
    pool = quiet_pool
    tenant_id, _ = create_tenant(pool, TenantSpec(name="dead-index"))
    # Given 5,000 events published since the table was last vacuumed (their entries in the index of
    # unpublished events are dead, pointing at rows that left it)
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO outbox_events (event_id, tenant_id, event_type, payload) "
            "SELECT gen_random_uuid(), %s, 'test.published.v1', jsonb_build_object('pad', repeat('x', 400)) "
            "FROM generate_series(1, 5000)",
            (tenant_id,),
        )
    with pool.connection() as conn:
        conn.execute(
            "UPDATE outbox_events SET published_at = now() WHERE tenant_id = %s AND published_at IS NULL",
            (tenant_id,),
        )
        published_by = conn.execute("SELECT txid_current() AS xid").fetchone()
    assert published_by is not None
    _wait_for_no_older_snapshot(pool, published_by["xid"])
    # When claims read that index by bitmap (the plan for few expected rows), they mark nothing
    # dead, and each visits every published row's page again
    _claim_blocks(pool, "SET LOCAL enable_indexscan = off")
    by_bitmap = _claim_blocks(pool, "SET LOCAL enable_indexscan = off")
    assert by_bitmap > 100
    # Then a claim as the relay makes it (in index order) marks the dead entries once, and the
    # next steps over them
    _claim_blocks(pool, RELAY_Q["claim_by_index"])
    in_order = _claim_blocks(pool, RELAY_Q["claim_by_index"])
    assert in_order * 5 < by_bitmap, (in_order, by_bitmap)
