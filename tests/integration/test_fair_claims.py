"""The fair claim against a real backlog: one tenant's thousands of queued jobs do not starve
another tenant's single job, and interactive work goes first without starving batch work; the same
when a process's claims share the tenant loads one of them read."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from prometheus_client import REGISTRY

from fix_db import buffers_touched, database_of_its_own
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common import states
from services.common.db import SyncPool
from services.inference.claims import Claims, Completion, Started
from services.inference.claims import Q as CLAIMS_Q
from services.limiter.model import Grant


@pytest.fixture
def fresh_pool(database_url: str) -> Iterator[SyncPool]:
    """A database no running worker watches, so only this test claims from it."""
    with database_of_its_own(database_url, "fair") as (_, pool):
        yield pool


def _queue_jobs(
    pool: SyncPool, tenant_id: uuid.UUID, count: int, priority: str = "batch", age_s: int = 0
) -> None:
    """Insert ``count`` READY jobs for the tenant in one statement (the backlog a burst leaves), due
    one millisecond apart in the order of ``g`` and all before the statement's ``now()``: a claim
    made right after finds every one of them due."""
    doc_id = uuid.uuid4()
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text)"
            " VALUES (%s, %s, 1, 'x', 1, 'x')",
            (tenant_id, doc_id),
        )
        conn.execute(
            """
            INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id,
                document_version, object_version, doc_bytes, estimated_tokens, schema_version,
                policy_version, model_policy, priority, state, available_at, deadline_at, created_at)
            SELECT gen_random_uuid(), %(t)s, 'k' || g || '-' || %(p)s || %(d)s, 'h', %(d)s, 1, 'v1', 1, 10,
                   'invoice.v1', 'p', 'default', %(p)s, 'READY',
                   now() - make_interval(secs => %(age)s) - (%(n)s + 1 - g) * interval '1 millisecond',
                   now() + interval '1 day', now()
            FROM generate_series(1, %(n)s) AS g
            """,
            {"t": tenant_id, "n": count, "p": priority, "d": doc_id, "age": age_s},
        )


# Each fairness test runs twice: every claim reading the tenants' loads, and the worker's way, a
# process's claims sharing one read and counting their own starts (services/inference/loads.py).
@pytest.fixture(params=[0.0, 60.0], ids=["loads-read-each-claim", "loads-kept"])
def loads_seconds(request: pytest.FixtureRequest) -> float:
    seconds: float = request.param
    return seconds


def _claims(pool: SyncPool, loads_seconds: float = 0.0) -> Claims:
    return Claims(
        pool, worker_id="test", model="m", lease_seconds=60, aging_seconds=30, loads_seconds=loads_seconds
    )


def _grant(tenant_id: uuid.UUID, tokens: int, request_key: str) -> Grant:
    return Grant(permit_id=f"p-{uuid.uuid4()}", lease_expires_at_ms=0)


def _never_released(grant: Grant) -> None:
    raise AssertionError(f"permit {grant.permit_id} was released, but its claim committed")


def _claim_tenants(pool: SyncPool, n: int, loads_seconds: float) -> list[Any]:
    claims = _claims(pool, loads_seconds)
    order = []
    for _ in range(n):
        started = claims.claim(_grant, _never_released)
        assert isinstance(started, Started)
        order.append(started.job)
    return order


def test_one_tenants_backlog_does_not_starve_another_tenants_single_job(
    fresh_pool: SyncPool, loads_seconds: float
) -> None:
    # Given tenant A with 2,000 queued jobs, queued first
    a, _ = create_tenant(fresh_pool, TenantSpec(name="A", max_in_flight=100))
    b, _ = create_tenant(fresh_pool, TenantSpec(name="B", max_in_flight=100))
    _queue_jobs(fresh_pool, a, 2000, age_s=60)
    # When tenant B submits one job and workers claim
    _queue_jobs(fresh_pool, b, 1)
    claimed = _claim_tenants(fresh_pool, 3, loads_seconds)
    # Then B's job is among the first claims, not after A's backlog
    assert b in [job.tenant_id for job in claimed[:2]]


def test_tenants_are_served_by_weight(fresh_pool: SyncPool, loads_seconds: float) -> None:
    heavy, _ = create_tenant(fresh_pool, TenantSpec(name="heavy", weight=3, max_in_flight=100))
    light, _ = create_tenant(fresh_pool, TenantSpec(name="light", weight=1, max_in_flight=100))
    _queue_jobs(fresh_pool, heavy, 100)
    _queue_jobs(fresh_pool, light, 100)
    claimed = [job.tenant_id for job in _claim_tenants(fresh_pool, 40, loads_seconds)]
    assert claimed.count(heavy) == 30
    assert claimed.count(light) == 10


def test_a_tenant_at_its_in_flight_cap_is_skipped(fresh_pool: SyncPool, loads_seconds: float) -> None:
    capped, _ = create_tenant(fresh_pool, TenantSpec(name="capped", max_in_flight=2))
    _queue_jobs(fresh_pool, capped, 10)
    claims = _claims(fresh_pool, loads_seconds)
    assert isinstance(claims.claim(_grant, _never_released), Started)
    assert isinstance(claims.claim(_grant, _never_released), Started)
    assert claims.claim(_grant, _never_released) is None


def test_interactive_goes_first_but_aged_batch_work_is_not_starved(
    fresh_pool: SyncPool, loads_seconds: float
) -> None:
    tenant, _ = create_tenant(fresh_pool, TenantSpec(name="mixed", max_in_flight=100))
    _queue_jobs(fresh_pool, tenant, 1, priority="batch", age_s=5)
    _queue_jobs(fresh_pool, tenant, 1, priority="interactive")
    _queue_jobs(fresh_pool, tenant, 1, priority="batch", age_s=120)
    claimed = [job.priority for job in _claim_tenants(fresh_pool, 3, loads_seconds)]
    # The batch job that waited 120 s beats the fresh interactive one (aging 30 s); the interactive
    # one beats the batch job that waited only 5 s.
    assert claimed == ["batch", "interactive", "batch"]


def _loads_reads() -> float:
    return REGISTRY.get_sample_value("fatura_inference_tenant_loads_reads_total") or 0.0


def test_a_process_reads_the_tenant_loads_once_for_many_claims(fresh_pool: SyncPool) -> None:
    # Given two tenants with five due jobs each, and a worker that keeps the loads it reads
    a, _ = create_tenant(fresh_pool, TenantSpec(name="A", max_in_flight=100))
    b, _ = create_tenant(fresh_pool, TenantSpec(name="B", max_in_flight=100))
    _queue_jobs(fresh_pool, a, 5)
    _queue_jobs(fresh_pool, b, 5)
    before = _loads_reads()
    # When it claims eight of them
    claimed = [job.tenant_id for job in _claim_tenants(fresh_pool, 8, 60.0)]
    # Then one read served every claim, and its own starts kept the share even
    assert _loads_reads() - before == 1
    assert claimed.count(a) == 4 and claimed.count(b) == 4


def test_a_tenant_whose_jobs_arrive_after_the_read_is_claimed_once_the_kept_ones_have_none(
    fresh_pool: SyncPool,
) -> None:
    # Given a worker that read the loads while only tenant A had a job, and claimed it
    a, _ = create_tenant(fresh_pool, TenantSpec(name="A", max_in_flight=100))
    b, _ = create_tenant(fresh_pool, TenantSpec(name="B", max_in_flight=100))
    _queue_jobs(fresh_pool, a, 1)
    claims = _claims(fresh_pool, 60.0)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started) and first.job.tenant_id == a
    before = _loads_reads()
    # When tenant B's first job arrives and the worker claims again
    _queue_jobs(fresh_pool, b, 1)
    second = claims.claim(_grant, _never_released)
    # Then finding nothing among what it kept, it read again and started B's job
    assert isinstance(second, Started) and second.job.tenant_id == b
    assert _loads_reads() - before == 1
    # And with nothing due anywhere, a claim says so
    assert claims.claim(_grant, _never_released) is None


def test_a_completion_frees_its_tenants_place_in_the_kept_loads(fresh_pool: SyncPool) -> None:
    # Given a tenant that may run one job at a time, its first job started by a worker that keeps
    # the loads it reads
    capped, _ = create_tenant(fresh_pool, TenantSpec(name="one-at-a-time", max_in_flight=1))
    _queue_jobs(fresh_pool, capped, 3)
    claims = _claims(fresh_pool, 60.0)
    first = claims.claim(_grant, _never_released)
    assert isinstance(first, Started)
    assert claims.claim(_grant, _never_released) is None  # at its cap
    before = _loads_reads()
    # When the job completes and the slot claims the next in the same transaction
    done = Completion(states.SUCCEEDED, (), result={"x": 1})
    written, second = claims.complete_then_claim(first.job, done, (_grant, _never_released))
    # Then the tenant's next job starts from the kept loads, with no read
    assert written and isinstance(second, Started) and second.job.tenant_id == capped
    assert _loads_reads() - before == 0


def _running(pool: SyncPool, tenant_id: uuid.UUID) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM extraction_jobs WHERE tenant_id = %s AND state = 'RUNNING'",
            (tenant_id,),
        ).fetchone()
    assert row is not None
    return int(row["n"])


def test_slots_that_complete_and_claim_on_keep_the_tenants_in_flight_by_weight(
    fresh_pool: SyncPool, loads_seconds: float
) -> None:
    # Given a tenant of weight 3 and one of weight 1, each with a backlog, and four slots started
    heavy, _ = create_tenant(fresh_pool, TenantSpec(name="heavy", weight=3, max_in_flight=100))
    light, _ = create_tenant(fresh_pool, TenantSpec(name="light", weight=1, max_in_flight=100))
    _queue_jobs(fresh_pool, heavy, 40)
    _queue_jobs(fresh_pool, light, 40)
    claims = _claims(fresh_pool, loads_seconds)
    slots = [claims.claim(_grant, _never_released) for _ in range(4)]
    assert all(isinstance(s, Started) for s in slots)
    done = Completion(states.SUCCEEDED, (), result={"x": 1})
    # When each slot, in turn, completes its job and claims its next one in the same transaction
    # (with kept loads, the completion's statement locks the head that claim takes)
    started: list[uuid.UUID] = []
    for turn in range(24):
        slot = slots[turn % 4]
        assert isinstance(slot, Started)
        written, slots[turn % 4] = claims.complete_then_claim(slot.job, done, (_grant, _never_released))
        nxt = slots[turn % 4]
        assert written and isinstance(nxt, Started)
        started.append(nxt.job.tenant_id)
        # Then three of every four running jobs are the heavy tenant's after every turn
        assert (_running(fresh_pool, heavy), _running(fresh_pool, light)) == (3, 1)
    assert started.count(heavy) == 18 and started.count(light) == 6
    # And every job the completions' statements locked and did not start is still due
    with fresh_pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM extraction_jobs WHERE state IN ('READY', 'RETRY_SCHEDULED')"
        ).fetchone()
    assert row is not None and row["n"] == 80 - 4 - 24


def test_a_permit_granted_inside_a_claim_whose_transaction_fails_is_released_as_not_sent(
    fresh_pool: SyncPool, database_url: str
) -> None:
    # Given a due job, and a database session that dies right after the limiter granted a permit
    tenant_id, _ = create_tenant(fresh_pool, TenantSpec(name="cut"))
    _queue_jobs(fresh_pool, tenant_id, 1)
    released: list[str] = []

    def grant_then_lose_the_session(tenant: uuid.UUID, tokens: int, request_key: str) -> Grant:
        with psycopg.connect(f"{database_url}_fair", autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'fatura-fair' AND state = 'idle in transaction'"
            )
        return Grant(permit_id="p-granted", lease_expires_at_ms=0)

    # When the claim tries to commit
    with pytest.raises(psycopg.OperationalError):
        _claims(fresh_pool).claim(grant_then_lose_the_session, lambda g: released.append(g.permit_id))
    # Then the permit went back to the limiter, and the job is still READY for the next claim
    assert released == ["p-granted"]
    with fresh_pool.connection() as conn:
        row = conn.execute(
            "SELECT state, attempt FROM extraction_jobs WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
    assert row is not None and (row["state"], row["attempt"]) == ("READY", 0)


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-statistics", "analyzed"])
def test_a_tenants_next_job_is_found_among_its_own_jobs_however_long_anothers_backlog(
    fresh_pool: SyncPool, analyzed: bool
) -> None:
    # Given tenant A's 5,000 queued jobs, all older than tenant B's one
    a = create_tenant(fresh_pool, TenantSpec(name="a"))[0]
    b = create_tenant(fresh_pool, TenantSpec(name="b"))[0]
    _queue_jobs(fresh_pool, a, 5000, age_s=3600)
    _queue_jobs(fresh_pool, b, 1)
    if analyzed:  # what autovacuum's ANALYZE leaves the planner; without it, its defaults
        with fresh_pool.connection() as conn:
            conn.execute("ANALYZE extraction_jobs")
    # When a claim reads B's head and the loads of both tenants
    head = buffers_touched(fresh_pool, CLAIMS_Q["head_job"], {"tenant_id": b, "priority": "batch"})
    loads = buffers_touched(fresh_pool, CLAIMS_Q["tenant_loads"], {})
    # Then B's head costs a few index pages, not a walk of A's jobs in time order (5,000 heap
    # fetches), and the loads a few pages per tenant
    assert head < 30, head
    assert loads < 60, loads
