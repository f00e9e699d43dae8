"""A job's start and its completion each take one short transaction: the claim reads what the attempt
needs (document, allowed currencies, master data) with the start, and completions wake the relay
with a NOTIFY one of their own transactions carries at most once per window, not a transaction each.
The start and the completion each write their row, hops and events in one statement."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from fix_db import database_of_its_own
from fix_pipeline import wait_until
from services.acceptance.tenants import Supplier, TenantSpec, create_tenant, import_suppliers
from services.common import events, states
from services.common.db import SyncPool
from services.common.uow import UnitOfWork
from services.inference.claims import Claims, Completion, Started
from services.inference.claims import Q as CLAIMS_Q
from services.inference.nudge import RelayNudge
from services.inference.providers.base import ErrorClass, Hop
from services.limiter.model import Grant

TEXT = "Invoice INV-1\fTotal 118.00 EUR"


@pytest.fixture
def fresh_pool(database_url: str) -> Iterator[SyncPool]:
    """A database no running worker or relay watches, so only this test claims and listens."""
    with database_of_its_own(database_url, "claimtx", max_size=3) as (_, pool):
        yield pool


def _queue_job(pool: SyncPool, tenant_id: uuid.UUID) -> uuid.UUID:
    doc_id, job_id = uuid.uuid4(), uuid.uuid4()
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text)"
            " VALUES (%s, %s, 1, 'x', 1, %s)",
            (tenant_id, doc_id, TEXT),
        )
        conn.execute(
            """
            INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id,
                document_version, object_version, doc_bytes, estimated_tokens, schema_version,
                policy_version, model_policy, priority, state, available_at, deadline_at, created_at)
            VALUES (%s, %s, %s, 'h', %s, 1, 'v1', 1, 10, 'invoice.v1', 'p', 'default', 'batch',
                    'READY', now(), now() + interval '1 day', now())
            """,
            (job_id, tenant_id, str(job_id), doc_id),
        )
        conn.execute(
            "INSERT INTO suppliers (tenant_id, tax_id, name, iban, currency)"
            " VALUES (%s, '1234567890', 'Acme', NULL, 'EUR') ON CONFLICT DO NOTHING",
            (tenant_id,),
        )
    return job_id


def _grant(*_: object) -> Grant:
    return Grant(permit_id=f"p-{uuid.uuid4()}", lease_expires_at_ms=0)


def _never_released(grant: Grant) -> None:
    raise AssertionError(f"permit {grant.permit_id} was released, but its claim committed")


def test_a_started_claim_carries_its_document_currencies_and_master_data(fresh_pool: SyncPool) -> None:
    # Given a tenant with one due job and one supplier
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="ctx", allowed_currencies=("EUR", "TRY")))
    job_id = _queue_job(fresh_pool, tenant_id)
    # When a slot claims it
    started = Claims(fresh_pool, worker_id="t", model="m", lease_seconds=60, aging_seconds=30).claim(
        _grant, _never_released
    )
    # Then the start hands over what validation needs, read in the claim's own transaction
    assert isinstance(started, Started) and started.job.job_id == job_id
    assert started.context.source_text == TEXT
    assert started.context.allowed_currencies == frozenset({"EUR", "TRY"})
    assert [s.name for s in started.context.suppliers.values()] == ["Acme"]


def _supplier_reads() -> float:
    return REGISTRY.get_sample_value("fatura_inference_supplier_reads_total") or 0.0


def test_a_claim_reads_the_master_data_again_only_after_it_changed(fresh_pool: SyncPool) -> None:
    # Given a tenant with one supplier and four due jobs, claimed by one worker's slots
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="master"))
    for _ in range(4):
        _queue_job(fresh_pool, tenant_id)
    claims = Claims(fresh_pool, worker_id="t", model="m", lease_seconds=60, aging_seconds=30)
    before = _supplier_reads()
    first, second = (claims.claim(_grant, _never_released) for _ in range(2))
    # Then the master data was read once, and both attempts validate against it
    assert isinstance(first, Started) and isinstance(second, Started)
    assert _supplier_reads() - before == 1
    assert dict(second.context.suppliers) == dict(first.context.suppliers)
    assert [(s.name, s.iban) for s in first.context.suppliers.values()] == [("Acme", None)]
    # When an import changes a supplier and adds one
    import_suppliers(
        fresh_pool,
        tenant_id,
        [
            Supplier("1234567890", "Acme", "TR330006100519786457841326", "EUR"),
            Supplier("DE999", "Beta", None, None),
        ],
    )
    third = claims.claim(_grant, _never_released)
    # Then the next claim reads it again and sees both changes; the one after reads nothing
    assert isinstance(third, Started)
    assert _supplier_reads() - before == 2
    assert {k: (s.name, s.iban) for k, s in third.context.suppliers.items()} == {
        "1234567890": ("Acme", "TR330006100519786457841326"),
        "DE999": ("Beta", None),
    }
    fourth = claims.claim(_grant, _never_released)
    assert isinstance(fourth, Started) and dict(fourth.context.suppliers) == dict(third.context.suppliers)
    assert _supplier_reads() - before == 2
    # And the attempt already running keeps the master data of its own claim
    assert [(s.name, s.iban) for s in first.context.suppliers.values()] == [("Acme", None)]


def test_every_way_of_changing_suppliers_moves_the_tenants_version_once_per_transaction(
    fresh_pool: SyncPool,
) -> None:
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="versions"))
    other_id, _ = create_tenant(fresh_pool, TenantSpec(name="others"))

    def versions() -> tuple[int, int]:
        with fresh_pool.connection() as conn:
            rows = conn.execute(
                "SELECT id, suppliers_version FROM tenants WHERE id = ANY(%s)", ([tenant_id, other_id],)
            ).fetchall()
        version = {row["id"]: row["suppliers_version"] for row in rows}
        return version[tenant_id], version[other_id]

    seen = [versions()]
    with fresh_pool.connection() as conn, conn.transaction():
        for n in range(50):  # fifty rows in one transaction: one new version
            conn.execute(
                "INSERT INTO suppliers (tenant_id, tax_id, name) VALUES (%s, %s, 'S')", (tenant_id, f"T{n}")
            )
        xid = conn.execute("SELECT pg_current_xact_id()::text::bigint AS xid").fetchone()["xid"]
    seen.append(versions())
    assert seen[-1] == (xid, seen[0][1])  # the other tenant's is untouched
    statements = (
        "UPDATE suppliers SET name = 'R' WHERE tenant_id = %s AND tax_id = 'T1'",
        "DELETE FROM suppliers WHERE tenant_id = %s AND tax_id = 'T2'",
    )
    for statement in statements:
        with fresh_pool.connection() as conn:
            conn.execute(statement, (tenant_id,))
        seen.append(versions())
        assert seen[-1][0] != seen[-2][0] and seen[-1][1] == seen[0][1]
    with fresh_pool.connection() as conn:
        conn.execute("TRUNCATE suppliers")
    seen.append(versions())
    assert seen[-1][0] != seen[-2][0] and seen[-1][1] != seen[-2][1]


class _Nudges:
    """What a completion told the nudge; it never carries a NOTIFY."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def ride(self, conn: object) -> float | None:
        self.calls.append("ride")
        return None

    def carried(self, ride: float) -> None:
        self.calls.append("carried")

    def poke(self) -> None:
        self.calls.append("poke")


def _counted(how: str) -> float:
    return REGISTRY.get_sample_value("fatura_inference_relay_nudges_total", {"how": how}) or 0.0


def _started_claims(pool: SyncPool, name: str, nudge: object) -> tuple[Claims, list[Started]]:
    """Claims with ``nudge`` and two started jobs of a new tenant."""
    tenant_id, _ = create_tenant(pool, TenantSpec(name=name))
    _queue_job(pool, tenant_id)
    _queue_job(pool, tenant_id)
    claims = Claims(
        pool,
        worker_id="t",
        model="m",
        lease_seconds=60,
        aging_seconds=30,
        nudge=nudge,  # type: ignore[arg-type]
    )
    started = [claims.claim(_grant, _never_released) for _ in range(2)]
    assert all(isinstance(s, Started) for s in started)
    return claims, started  # type: ignore[return-value]


def test_a_completion_that_carries_no_notify_sends_none_of_its_own_and_pokes_the_nudge(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given a started job, a relay listening, and a nudge that lets no completion carry a NOTIFY
    nudge = _Nudges()
    claims, (started, _) = _started_claims(fresh_pool, "nudge", nudge)
    with psycopg.connect(f"{database_url}_claimtx", autocommit=True) as listener:
        listener.execute("LISTEN fatura_outbox")
        # When the attempt completes with a state that publishes an event
        assert claims.complete(started.job, Completion(states.SUCCEEDED, (), result={"x": 1}))
        # Then the completion sent no NOTIFY of its own: it poked the nudge once
        assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
    assert nudge.calls == ["ride", "poke"]
    with fresh_pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM outbox_events WHERE job_id = %s AND event_type = %s",
            (started.job.job_id, events.EXTRACTION_COMPLETED),
        ).fetchone()
    assert row is not None and row["n"] == 1


def test_one_completion_per_window_carries_the_notify_in_its_own_transaction(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given two started jobs and the worker's nudge with a long window
    nudge = RelayNudge(fresh_pool, window=30.0)
    claims, (first, second) = _started_claims(fresh_pool, "ride", nudge)
    carried, sent = _counted("carried"), _counted("sent")
    try:
        with psycopg.connect(f"{database_url}_claimtx", autocommit=True) as listener:
            listener.execute("LISTEN fatura_outbox")
            # When both complete, one right after the other
            assert claims.complete(first.job, Completion(states.SUCCEEDED, (), result={"x": 1}))
            heard = list(listener.notifies(timeout=2.0, stop_after=1))
            assert claims.complete(second.job, Completion(states.SUCCEEDED, (), result={"x": 1}))
            # Then the first completion's own transaction woke the relay at once (a NOTIFY sent
            # after the window would come 30 s later), and the second, in the same window, sent none
            assert [n.channel for n in heard] == ["fatura_outbox"]
            assert list(listener.notifies(timeout=0.5, stop_after=1)) == []
            assert (_counted("carried") - carried, _counted("sent") - sent) == (1.0, 0.0)
            # And the second's NOTIFY is sent when the worker stops, not lost
            nudge.close()
            assert len(list(listener.notifies(timeout=2.0, stop_after=1))) == 1
    finally:
        nudge.close()


def test_completions_that_carried_none_get_a_notify_after_the_window_unless_a_later_one_carried_it(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given the worker's nudge with a short window, and a relay listening
    nudge = RelayNudge(fresh_pool, window=0.15)
    sent, covered = _counted("sent"), _counted("covered")
    try:
        with psycopg.connect(f"{database_url}_claimtx", autocommit=True) as listener:
            listener.execute("LISTEN fatura_outbox")
            # When a commit carried no NOTIFY and nothing carried one after it
            nudge.poke()
            # Then the nudge sends one of its own once the window has passed
            assert len(list(listener.notifies(timeout=3.0, stop_after=1))) == 1
            # (counted once its transaction has returned, which may be after the relay heard it)
            wait_until(lambda: _counted("sent") - sent == 1.0, 5, "the NOTIFY counted as sent")
            # And when a commit that carried none is followed by one that carried it
            nudge.poke()
            with fresh_pool.connection() as conn:
                ride = nudge.ride(conn)
            assert ride is not None
            nudge.carried(ride)
            # Then the relay hears that NOTIFY only: the one after the window is not sent
            assert len(list(listener.notifies(timeout=1.0, stop_after=2))) == 1
    finally:
        nudge.close()
    assert _counted("sent") - sent == 1.0
    assert _counted("covered") - covered == 1.0


def test_many_pokes_in_a_burst_send_few_notifies_and_none_is_lost(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given a relay listening and the worker's nudge
    nudge = RelayNudge(fresh_pool, window=0.2)
    try:
        with psycopg.connect(f"{database_url}_claimtx", autocommit=True) as listener:
            listener.execute("LISTEN fatura_outbox")
            # When 200 completions poke it at once
            for _ in range(200):
                nudge.poke()
            # Then the relay is woken, by far fewer NOTIFYs than pokes
            woken = list(listener.notifies(timeout=3.0, stop_after=200))
    finally:
        nudge.close()
    assert 1 <= len(woken) <= 5
    assert {n.channel for n in woken} == {"fatura_outbox"}


def _claims(pool: SyncPool) -> Claims:
    return Claims(pool, worker_id="t", model="m", lease_seconds=60, aging_seconds=30, nudge=_Nudges())


def _kept_claims(pool: SyncPool) -> Claims:
    """Claims as a worker that keeps the tenant loads makes them: its completions lock the next head."""
    return Claims(
        pool, worker_id="t", model="m", lease_seconds=60, aging_seconds=30, nudge=_Nudges(), loads_seconds=60
    )


def _state(pool: SyncPool, job_id: uuid.UUID) -> tuple[str, int]:
    with pool.connection() as conn:
        row = conn.execute("SELECT state, fence FROM extraction_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row["state"], row["fence"]


def test_a_completion_claims_the_slots_next_job_in_its_own_transaction(fresh_pool: SyncPool) -> None:
    # Given two due jobs, the first one started by a slot
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="next"))
    _queue_job(fresh_pool, tenant_id)
    _queue_job(fresh_pool, tenant_id)
    claims = _claims(fresh_pool)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started)
    # When its attempt completes and the slot goes on
    written, second = claims.complete_then_claim(
        first.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (_grant, _never_released)
    )
    # Then the outcome is written and the other job started, with its document
    assert written and isinstance(second, Started) and second.job.job_id != first.job.job_id
    assert _state(fresh_pool, first.job.job_id)[0] == states.SUCCEEDED
    assert _state(fresh_pool, second.job.job_id)[0] == states.RUNNING
    assert second.context.source_text == TEXT
    # And when nothing else is due, the last completion finds nothing and starts nothing
    written, nothing = claims.complete_then_claim(
        second.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (_grant, _never_released)
    )
    assert written and nothing is None


def test_with_kept_loads_a_completion_locks_the_next_head_in_its_own_statement(
    fresh_pool: SyncPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three due jobs, the first one started by a slot whose process keeps the tenant loads
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="kept"))
    queued = [_queue_job(fresh_pool, tenant_id) for _ in range(3)]
    claims = _kept_claims(fresh_pool)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started)
    statements: list[str] = []
    execute = UnitOfWork.execute

    def counted(self: UnitOfWork, query: Any, params: Any = None) -> Any:
        statements.append(next(name for name, text in CLAIMS_Q.items() if text == query))
        return execute(self, query, params)

    monkeypatch.setattr(UnitOfWork, "execute", counted)
    # When its attempt completes and the slot goes on
    written, second = claims.complete_then_claim(
        first.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (_grant, _never_released)
    )
    # Then the other job started, found by the completion's own statement: two statements, not three
    assert written and isinstance(second, Started) and second.job.job_id != first.job.job_id
    assert _state(fresh_pool, second.job.job_id)[0] == states.RUNNING
    assert statements == ["complete_job_then_head", "start_job"]
    # And a stale completion that locked a head still starts it, and leaves the newer owner's job alone
    with fresh_pool.connection() as conn:
        conn.execute("UPDATE extraction_jobs SET fence = fence + 1 WHERE id = %s", (second.job.job_id,))
    statements.clear()
    written, third = claims.complete_then_claim(
        second.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (_grant, _never_released)
    )
    assert not written and isinstance(third, Started)
    assert {first.job.job_id, second.job.job_id, third.job.job_id} == set(queued)
    assert _state(fresh_pool, second.job.job_id) == (states.RUNNING, second.job.fence + 1)
    assert statements == ["complete_job_then_head", "start_job"]


def _subplan_loops(plan: dict[str, Any]) -> list[int]:
    """The number of times each subquery of an EXPLAIN ANALYZE plan (JSON) ran."""
    loops = [int(plan["Actual Loops"])] if plan.get("Parent Relationship") == "SubPlan" else []
    for child in plan.get("Plans", []):
        loops += _subplan_loops(child)
    return loops


def test_a_head_read_past_jobs_other_slots_hold_reads_the_tenants_next_heads_once(
    fresh_pool: SyncPool,
) -> None:
    # Given twelve due jobs of a tenant, the eight oldest held by other slots' open transactions
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="held-heads"))
    queued = [_queue_job(fresh_pool, tenant_id) for _ in range(12)]
    holders = [psycopg.connect(fresh_pool.conninfo) for _ in range(8)]
    try:
        for holder, job_id in zip(holders, queued[:8], strict=True):
            holder.execute("SELECT 1 FROM extraction_jobs WHERE id = %s FOR UPDATE", (job_id,))
        # When a slot reads the head (as a claim does, and a completion for its slot's next claim)
        params = {"tenant_id": tenant_id, "priority": "batch"}
        with fresh_pool.connection() as conn, conn.transaction():
            head = conn.execute(CLAIMS_Q["head_job"], params).fetchone()
            explained = conn.execute(
                "EXPLAIN (ANALYZE, FORMAT JSON) " + CLAIMS_Q["head_job"], params
            ).fetchone()
            raise psycopg.Rollback
    finally:
        for holder in holders:
            holder.close()
    # Then it locks the first free job, and the tenant's next heads are read for it alone, not
    # again for each held job the scan passed
    assert head is not None and head["id"] == queued[8]
    assert explained is not None
    loops = _subplan_loops(explained["QUERY PLAN"][0]["Plan"])
    assert loops == [1, 1], loops


def _waits_on_a_lock(pool: SyncPool, application_name: str) -> bool:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE application_name = %s AND wait_event_type = 'Lock'",
            (application_name,),
        ).fetchone()
    return bool(row and row["n"])


def test_a_completion_held_up_on_its_own_row_leaves_no_lock_on_a_job_another_slot_started(
    fresh_pool: SyncPool,
) -> None:
    # Given three due jobs, slot B running the first, and its row locked for a moment by another session
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="held"))
    queued = [_queue_job(fresh_pool, tenant_id) for _ in range(3)]
    claims = _kept_claims(fresh_pool)
    b = claims.claim(_grant, _never_released)
    assert isinstance(b, Started) and b.job.job_id == queued[0]
    limiter_answers = threading.Event()

    def slow_grant(*_: object) -> Grant:
        # B's next claim asks the limiter, inside the completion's transaction
        limiter_answers.wait(30)
        return _grant()

    b_next: list[Any] = []
    with psycopg.connect(fresh_pool.conninfo) as other:
        other.execute("SELECT 1 FROM extraction_jobs WHERE id = %s FOR UPDATE", (b.job.job_id,))
        slot_b = threading.Thread(
            target=lambda: b_next.append(
                claims.complete_then_claim(
                    b.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (slow_grant, _never_released)
                )
            )
        )
        slot_b.start()
        # When B's completion statement waits on that lock, slot A claims a job and starts it
        wait_until(lambda: _waits_on_a_lock(fresh_pool, "fatura-claimtx"), 10, "B waiting on the lock")
        a = claims.claim(_grant, _never_released)
        assert isinstance(a, Started)
        other.rollback()  # B's statement goes on, and B's next claim waits on the limiter
    try:
        # Then A's completion does not wait for B's transaction: B's statement did not lock A's job
        slot_a = threading.Thread(
            target=lambda: claims.complete(a.job, Completion(states.SUCCEEDED, (), result={"x": 1}))
        )
        slot_a.start()
        slot_a.join(10)
        assert not slot_a.is_alive(), "A's completion waited on B's open transaction"
        assert _state(fresh_pool, a.job.job_id)[0] == states.SUCCEEDED
    finally:
        limiter_answers.set()
        slot_b.join(30)
        slot_a.join(30)
    # And B's job is done and its slot started the third job
    ((written, claimed),) = b_next
    assert written and isinstance(claimed, Started)
    assert {a.job.job_id, claimed.job.job_id} == set(queued[1:])


def test_a_stale_completion_that_claims_next_still_cannot_overwrite_the_newer_owner(
    fresh_pool: SyncPool,
) -> None:
    # Given a started job whose lease was taken over (fence bumped) while its call ran
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="stale"))
    _queue_job(fresh_pool, tenant_id)
    claims = _claims(fresh_pool)
    started = claims.claim(_grant, _never_released)
    assert isinstance(started, Started)
    with fresh_pool.connection() as conn:
        conn.execute("UPDATE extraction_jobs SET fence = fence + 1 WHERE id = %s", (started.job.job_id,))
    # When the stale worker completes and claims on
    written, claimed = claims.complete_then_claim(
        started.job, Completion(states.SUCCEEDED, (), result={"x": 1}), (_grant, _never_released)
    )
    # Then its result is refused and the newer owner's job is untouched
    assert not written and claimed is None
    assert _state(fresh_pool, started.job.job_id) == (states.RUNNING, started.job.fence + 1)


def test_a_failed_next_claim_gives_its_permit_back_and_leaves_the_outcome_to_be_written_alone(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given a started job, another due one, and a session that dies once the next permit is granted
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="cut"))
    _queue_job(fresh_pool, tenant_id)
    _queue_job(fresh_pool, tenant_id)
    claims = _claims(fresh_pool)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started)
    released: list[str] = []

    def grant_then_lose_the_session(*_: object) -> Grant:
        with psycopg.connect(f"{database_url}_claimtx", autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'fatura-claimtx' AND state = 'idle in transaction'"
            )
        return Grant(permit_id="p-next", lease_expires_at_ms=0)

    completion = Completion(states.SUCCEEDED, (), result={"x": 1})
    # When the completion's transaction fails after the next claim's grant
    with pytest.raises(psycopg.OperationalError):
        claims.complete_then_claim(
            first.job, completion, (grant_then_lose_the_session, lambda g: released.append(g.permit_id))
        )
    # Then the permit went back, nothing was written, and the outcome alone still can be
    assert released == ["p-next"]
    assert _state(fresh_pool, first.job.job_id)[0] == states.RUNNING
    assert claims.complete(first.job, completion)
    assert _state(fresh_pool, first.job.job_id)[0] == states.SUCCEEDED


def _hop(outcome: str = "ok", **fields: object) -> Hop:
    now = datetime.now(UTC)
    answered: dict[str, object] = {
        "http_status": 200,
        "input_tokens": 11,
        "output_tokens": 7,
        "latency_ms": 40,
        "time_to_first_token_ms": 12,
        "inter_token_ms": 1.5,
    }
    return Hop(
        channel="sim",
        model="m-1",
        started_at=now - timedelta(milliseconds=40),
        ended_at=now,
        outcome=outcome,
        **{**answered, **fields},  # type: ignore[arg-type]
    )


def _written(
    pool: SyncPool, job_id: uuid.UUID
) -> tuple[list[dict[str, object]], list[dict[str, object]], list[dict[str, object]]]:
    with pool.connection() as conn:
        attempts = conn.execute(
            "SELECT attempt, fence, outcome, channel, http_status, input_tokens, output_tokens, latency_ms,"
            " time_to_first_token_ms, inter_token_ms, error_class, error_message, worker_id,"
            " ended_at - started_at AS took FROM job_attempts WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
        history = conn.execute(
            "SELECT state, state_version, detail FROM job_events WHERE job_id = %s ORDER BY seq", (job_id,)
        ).fetchall()
        outbox = conn.execute(
            "SELECT event_type, payload FROM outbox_events WHERE job_id = %s ORDER BY created_at, event_id",
            (job_id,),
        ).fetchall()
    return attempts, history, outbox


def test_a_start_and_a_completion_each_write_their_row_hops_and_events_in_one_statement(
    fresh_pool: SyncPool,
) -> None:
    # Given a started job
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="one-statement"))
    job_id = _queue_job(fresh_pool, tenant_id)
    claims = _claims(fresh_pool)
    started = claims.claim(_grant, _never_released)
    assert isinstance(started, Started)
    # Then the start recorded its RUNNING event with the attempt, fence and lease it gave the job
    _, history, outbox = _written(fresh_pool, job_id)
    assert [(h["state"], h["state_version"]) for h in history] == [
        (states.RUNNING, started.job.state_version)
    ]
    detail = history[0]["detail"]
    assert isinstance(detail, dict)
    assert (detail["attempt"], detail["fence"]) == (started.job.attempt, started.job.fence)
    assert datetime.fromisoformat(str(detail["lease_until"])) > datetime.now(UTC)
    assert outbox == []
    # When its attempt succeeds after a failed hop and an answered one
    failed = _hop(
        "rate_limited", error_class=ErrorClass.RATE_LIMITED, error_message="slow down", http_status=429
    )
    assert claims.complete(started.job, Completion(states.SUCCEEDED, (failed, _hop()), result={"x": 1}))
    # Then both hops are logged as they ended, and the change is in the history and the outbox
    attempts, history, outbox = _written(fresh_pool, job_id)
    assert [(a["outcome"], a["http_status"], a["error_class"], a["error_message"]) for a in attempts] == [
        ("rate_limited", 429, "rate_limited", "slow down"),
        ("ok", 200, None, None),
    ]
    ok = attempts[1]
    assert (ok["attempt"], ok["fence"], ok["worker_id"]) == (started.job.attempt, started.job.fence, "t")
    assert (ok["input_tokens"], ok["output_tokens"], ok["latency_ms"]) == (11, 7, 40)
    assert (ok["time_to_first_token_ms"], ok["inter_token_ms"]) == (12, 1.5)
    assert ok["took"] == timedelta(milliseconds=40)
    version = started.job.state_version + 1
    assert [(h["state"], h["state_version"]) for h in history][-1] == (states.SUCCEEDED, version)
    assert [(o["event_type"], o["payload"]["state_version"]) for o in outbox] == [  # type: ignore[index]
        (events.EXTRACTION_COMPLETED, version)
    ]


def test_a_retry_publishes_nothing_a_refunded_attempt_logs_no_hop_and_a_stale_one_logs_its_hops_as_stale(
    fresh_pool: SyncPool,
) -> None:
    # Given a started job whose first attempt is scheduled for a retry
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="retry-refund-stale"))
    job_id = _queue_job(fresh_pool, tenant_id)
    claims = _claims(fresh_pool)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started)
    retry = Completion(
        states.RETRY_SCHEDULED,
        (_hop("server_error", error_class=ErrorClass.SERVER_ERROR, http_status=500),),
        error_class="provider_unavailable",
        available_at=datetime.now(UTC) - timedelta(seconds=1),
    )
    assert claims.complete(first.job, retry)
    # Then the retry is in the history and not in the outbox
    attempts, history, outbox = _written(fresh_pool, job_id)
    assert [h["state"] for h in history] == [states.RUNNING, states.RETRY_SCHEDULED]
    assert outbox == [] and [a["outcome"] for a in attempts] == ["server_error"]
    # When the second attempt sent nothing (refunded) and is scheduled again
    second = claims.claim(_grant, _never_released)
    assert isinstance(second, Started) and second.job.attempt == 2
    refunded = Completion(
        states.RETRY_SCHEDULED,
        (_hop("skipped", sent=False, skip_reason="breaker_open"),),
        available_at=datetime.now(UTC) - timedelta(seconds=1),
        refund_attempt=True,
    )
    assert claims.complete(second.job, refunded)
    # Then it logged no hop and gave its attempt back
    attempts, _, _ = _written(fresh_pool, job_id)
    assert [a["outcome"] for a in attempts] == ["server_error"]
    # And when the next attempt lost its lease to a newer owner before it completed
    third = claims.claim(_grant, _never_released)
    assert isinstance(third, Started) and third.job.attempt == 2
    with fresh_pool.connection() as conn:
        conn.execute("UPDATE extraction_jobs SET fence = fence + 1 WHERE id = %s", (job_id,))
    stale = Completion(states.SUCCEEDED, (_hop(),), result={"x": 1})
    assert not claims.complete(third.job, stale)
    # Then its call is logged as stale, and no event of it was written
    attempts, history, outbox = _written(fresh_pool, job_id)
    assert [(a["outcome"], a["fence"]) for a in attempts] == [("server_error", 1), ("stale", third.job.fence)]
    assert [h["state"] for h in history] == [states.RUNNING, states.RETRY_SCHEDULED] * 2 + [states.RUNNING]
    assert outbox == []
    assert _state(fresh_pool, job_id) == (states.RUNNING, third.job.fence + 1)
