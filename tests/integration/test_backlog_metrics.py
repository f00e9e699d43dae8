"""Metrics that count exactly: the runnable backlog and oldest eligible age per priority (never capped
at the wake-up target, one index-only scan per priority, measured on 12,000 eligible jobs) and the
webhook endpoints per breaker state."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import REGISTRY

from fix_db import database_of_its_own
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.broker import make_broker
from services.common.db import SyncPool
from services.common.settings import CommonSettings
from services.delivery.scheduler import refresh_endpoint_states
from services.inference.scheduler import Q, Scheduler
from services.inference.settings import InferenceSettings


@pytest.fixture
def scratch(database_url: str) -> Iterator[tuple[str, SyncPool]]:
    with database_of_its_own(database_url, "backlog") as scratch:
        yield scratch


def _insert(pool: SyncPool, tenant_id: uuid.UUID, count: int, priority: str, state: str, wait: str) -> None:
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
                policy_version, model_policy, priority, state, deadline_at, available_at)
            SELECT gen_random_uuid(), %(t)s, %(d)s::text || g, 'h', %(d)s, 1, 'v1', 1, 10, 'invoice.v1',
                   'p', 'default', %(p)s, %(s)s, now() + interval '1 day',
                   now() + %(w)s::interval - g * interval '1 millisecond'
            FROM generate_series(1, %(n)s) AS g
            """,
            {"t": tenant_id, "d": doc_id, "n": count, "p": priority, "s": state, "w": wait},
        )


def _sample(name: str, priority: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"priority": priority})


def test_backlog_gauges_count_every_eligible_job_per_priority_past_the_wakeup_target(
    scratch: tuple[str, SyncPool],
) -> None:
    url, pool = scratch
    tenants = [create_tenant(pool, TenantSpec(name=f"backlog-{i}"))[0] for i in range(4)]
    # Given 12,000 eligible jobs (9,000 batch, some waiting for a retry; 3,000 interactive), jobs
    # not yet due, and 40,000 finished jobs, across four tenants
    for tenant in tenants:
        _insert(pool, tenant, 1500, "batch", "READY", "-10 minutes")
        _insert(pool, tenant, 750, "batch", "RETRY_SCHEDULED", "-1 minute")
        _insert(pool, tenant, 750, "interactive", "READY", "-30 seconds")
        _insert(pool, tenant, 500, "batch", "RETRY_SCHEDULED", "+1 hour")
        _insert(pool, tenant, 10_000, "batch", "SUCCEEDED", "-1 day")
    _vacuum_until_all_visible(url)
    common = CommonSettings(database_url=url, queue_prefix=f"backlog-{uuid.uuid4().hex[:6]}")
    settings = InferenceSettings(common=common, worker_id="backlog-test", wakeup_target=64)
    scheduler = Scheduler(settings, pool, make_broker(common))

    # When the scheduler measures the backlog
    counts = scheduler.measure_backlog()

    # Then every eligible job is counted, per priority, far past the wake-up target of 64
    assert counts == {"batch": 9000, "interactive": 3000}
    assert _sample("fatura_scheduler_eligible_jobs", "batch") == 9000
    assert _sample("fatura_scheduler_eligible_jobs", "interactive") == 3000
    # And the oldest eligible age is that of each priority's oldest due job
    batch_age = _sample("fatura_scheduler_oldest_eligible_age_seconds", "batch")
    interactive_age = _sample("fatura_scheduler_oldest_eligible_age_seconds", "interactive")
    assert batch_age is not None and 600 <= batch_age < 660
    assert interactive_age is not None and 30 <= interactive_age < 90

    # And the count is an index-only scan of the backlog index, not a walk of the table
    with psycopg.connect(url) as conn:
        plan = "\n".join(
            row[0]
            for row in conn.execute(
                "EXPLAIN (ANALYZE, COSTS OFF) " + Q["runnable_backlog"],
                {"priorities": ["interactive", "batch"]},
            )
        )
    assert "Index Only Scan using extraction_jobs_backlog" in plan, f"{plan}\n{_visibility(url)}"
    assert "Seq Scan" not in plan, plan
    started = time.perf_counter()
    for _ in range(10):
        scheduler.measure_backlog()
    per_pass = (time.perf_counter() - started) / 10
    assert per_pass < 0.25, f"measuring the backlog took {per_pass * 1000:.1f} ms"


def test_backlog_gauges_read_zero_when_nothing_is_due(scratch: tuple[str, SyncPool]) -> None:
    url, pool = scratch
    tenant, _ = create_tenant(pool, TenantSpec(name="backlog-idle"))
    # Given only a job that is not due yet
    _insert(pool, tenant, 1, "interactive", "RETRY_SCHEDULED", "+5 minutes")
    common = CommonSettings(database_url=url, queue_prefix=f"backlog-{uuid.uuid4().hex[:6]}")
    scheduler = Scheduler(InferenceSettings(common=common, worker_id="idle"), pool, make_broker(common))

    # When the scheduler measures the backlog, Then both priorities read zero, not a stale value
    assert scheduler.measure_backlog() == {"interactive": 0, "batch": 0}
    assert _sample("fatura_scheduler_eligible_jobs", "interactive") == 0
    assert _sample("fatura_scheduler_oldest_eligible_age_seconds", "batch") == 0


def test_endpoint_breaker_states_are_counted_per_state_never_per_endpoint(
    scratch: tuple[str, SyncPool],
) -> None:
    _url, pool = scratch
    tenant, _ = create_tenant(pool, TenantSpec(name="endpoints"))
    # Given three healthy endpoints, two whose breaker is open and one disabled
    rows = [("enabled", None)] * 3 + [("enabled", "+1 minute")] * 2 + [("disabled", None)]
    with pool.connection() as conn:
        for state, open_for in rows:
            conn.execute(
                "INSERT INTO webhook_endpoints (id, tenant_id, url, event_types, state, breaker_open_until)"
                " VALUES (gen_random_uuid(), %s, 'https://erp.example/hook',"
                " ARRAY['extraction.completed.v1'],"
                " %s, now() + %s::interval)",
                (tenant, state, open_for),
            )
    # When the delivery scheduler refreshes its gauges
    counts = refresh_endpoint_states(pool)
    # Then each state has its count and no series names an endpoint
    assert counts == {"closed": 3, "open": 2, "disabled": 1}
    for state, count in counts.items():
        assert REGISTRY.get_sample_value("fatura_delivery_endpoints", {"state": state}) == count


def _visibility(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT relpages, relallvisible, reltuples FROM pg_class WHERE relname = 'extraction_jobs'"
        ).fetchone()
    return f"pg_class (relpages, relallvisible, reltuples): {row}"


def _vacuum_until_all_visible(url: str) -> None:
    """VACUUM ANALYZE until the visibility map covers the table (the premise of an index-only
    scan): a snapshot held elsewhere while the first VACUUM runs can keep pages from being marked."""
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(20):
            conn.execute("VACUUM ANALYZE extraction_jobs")
            row = conn.execute(
                "SELECT relpages, relallvisible FROM pg_class WHERE relname = 'extraction_jobs'"
            ).fetchone()
            if row is not None and row[1] >= row[0]:
                return
            time.sleep(0.5)
