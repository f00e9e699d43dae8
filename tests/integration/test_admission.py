"""Admission (DESIGN §5.2): each tenant limit answers 429, the system backlog 503.

Nothing accepted is ever dropped, and a refusal writes nothing.
"""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from fix_api import SubmitFn, job_body
from fix_db import MakeTenant, SyncPool, TenantHandle, count_rows, drop_database, recreate_database
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.acceptance.admission import estimate_tokens
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.db import sync_pool
from services.common.migrate import migrate
from services.common.settings import CommonSettings

PER_JOB_TOKENS = estimate_tokens(300, prompt_overhead=600, max_output=2048)


def _assert_refused(reply: httpx.Response, status: int, limit: str) -> dict[str, object]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["limit"] == limit
    assert int(reply.headers["retry-after"]) == error["retry_after_seconds"] >= 1
    assert "Nothing was created" in error["message"]
    assert f"Retry after {error['retry_after_seconds']} seconds" in error["message"]
    return error


def test_pending_jobs_cap_answers_429_and_keeps_every_accepted_job(
    submit: SubmitFn, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant(max_pending_jobs=3)
    accepted = [submit(tenant) for _ in range(3)]
    assert [r.status_code for r in accepted] == [202] * 3
    before = count_rows(pool, tenant.id)

    refused = submit(tenant)

    error = _assert_refused(refused, 429, "pending_jobs")
    assert error["code"] == "tenant_quota_exceeded"
    assert error["current"] == 3 and error["maximum"] == 3
    assert count_rows(pool, tenant.id) == before
    with pool.connection() as conn:
        states = conn.execute(
            "SELECT state FROM extraction_jobs WHERE tenant_id = %s", (tenant.id,)
        ).fetchall()
    assert [s["state"] for s in states] == ["READY"] * 3


def _race(base_url: str, tenant: TenantHandle, requests: int) -> list[httpx.Response]:
    """``requests`` new jobs for ``tenant``, sent at the same moment from as many threads."""
    barrier = threading.Barrier(requests)

    def send(i: int) -> httpx.Response:
        with httpx.Client(base_url=base_url, timeout=30.0) as c:
            barrier.wait()
            return c.post(
                "/v1/extraction-jobs",
                json=job_body(),
                headers={**tenant.headers, "Idempotency-Key": f"race-{i}"},
            )

    with ThreadPoolExecutor(max_workers=requests) as threads:
        return list(threads.map(send, range(requests)))


def test_requests_racing_for_a_tenants_last_places_never_take_more_than_its_cap(
    edge: ServiceProcess, submit: SubmitFn, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    for _ in range(3):
        # Given a tenant with room for 3 pending jobs, one of them already taken
        tenant = make_tenant(max_pending_jobs=3)
        assert submit(tenant).status_code == 202
        # When ten requests arrive at once, across the edge's two workers
        replies = _race(str(edge.base_url), tenant, 10)
        # Then exactly the two free places are taken, and every other request is a 429 naming the cap
        codes = Counter(r.status_code for r in replies)
        assert codes == {202: 2, 429: 8}, [r.text for r in replies]
        for reply in replies:
            if reply.status_code == 429:
                _assert_refused(reply, 429, "pending_jobs")
        with pool.connection() as conn:
            pending = conn.execute(
                "SELECT count(*) AS n FROM extraction_jobs WHERE tenant_id = %s", (tenant.id,)
            ).fetchone()
        assert pending is not None and pending["n"] == 3


def test_a_replay_of_an_accepted_job_is_answered_even_when_the_tenant_is_at_its_cap(
    submit: SubmitFn, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant(max_pending_jobs=1)
    first = submit(tenant, key="only-one")
    assert submit(tenant).status_code == 429

    again = submit(tenant, key="only-one")

    assert again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]


def test_pending_bytes_cap_answers_429(submit: SubmitFn, make_tenant: MakeTenant) -> None:
    tenant = make_tenant(max_pending_bytes=1000)
    assert submit(tenant, job_body("x" * 600)).status_code == 202

    _assert_refused(submit(tenant, job_body("y" * 600)), 429, "pending_bytes")
    assert submit(tenant, job_body("z" * 300)).status_code == 202  # what still fits is accepted


def test_pending_estimated_tokens_cap_answers_429(submit: SubmitFn, make_tenant: MakeTenant) -> None:
    tenant = make_tenant(max_pending_tokens=PER_JOB_TOKENS * 2)
    assert submit(tenant, job_body("a" * 300)).status_code == 202
    assert submit(tenant, job_body("b" * 300)).status_code == 202

    _assert_refused(submit(tenant, job_body("c" * 300)), 429, "pending_tokens")


def test_daily_token_budget_answers_429_until_midnight_utc_and_a_cancel_refunds_unused_tokens(
    client: httpx.Client, submit: SubmitFn, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant(daily_token_budget=PER_JOB_TOKENS)
    first = submit(tenant, job_body("a" * 300))
    assert first.status_code == 202

    error = _assert_refused(submit(tenant, job_body("b" * 300)), 429, "daily_token_budget")
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    assert abs(int(str(error["retry_after_seconds"])) - math.ceil((midnight - now).total_seconds())) <= 5

    # The cancelled job never reached the model, so its reservation is returned to today's budget.
    client.post(f"/v1/extraction-jobs/{first.json()['job_id']}:cancel", headers=tenant.headers)
    assert submit(tenant, job_body("c" * 300)).status_code == 202


@pytest.fixture(scope="module")
def small_system(spawn: SpawnFn, database_url: str) -> Iterator[tuple[ServiceProcess, str]]:
    """An edge on a database of its own whose whole system may hold only 2 runnable jobs."""
    url = database_url + "_backlog"
    recreate_database(url)
    migrate(url)
    edge = start_edge(spawn, workers=1, FATURA_DATABASE_URL=url, FATURA_MAX_SYSTEM_BACKLOG="2")
    yield edge, url
    edge.stop()
    drop_database(url)


def test_system_backlog_over_its_cap_answers_503_for_every_tenant(
    small_system: tuple[ServiceProcess, str],
) -> None:
    edge, url = small_system
    with sync_pool(CommonSettings(database_url=url), name="tests", max_size=1) as p:
        handles = [TenantHandle(*create_tenant(p, TenantSpec(name=n))) for n in ("a", "b", "c")]
    with httpx.Client(base_url=edge.base_url or "", timeout=10) as c:

        def post(t: TenantHandle) -> httpx.Response:
            return c.post(
                "/v1/extraction-jobs",
                json=job_body(),
                headers={**t.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
            )

        assert post(handles[0]).status_code == 202
        assert post(handles[1]).status_code == 202
        refused = post(handles[2])
        error = _assert_refused(refused, 503, "system_backlog")
        assert error["code"] == "system_backlog_full"
        assert post(handles[0]).status_code == 503
        with (
            sync_pool(CommonSettings(database_url=url), name="tests", max_size=1) as p,
            p.connection() as conn,
        ):
            row = conn.execute("SELECT count(*) AS n FROM extraction_jobs").fetchone()
        assert row is not None and row["n"] == 2


def test_admission_counters_match_the_jobs_table(pool: SyncPool) -> None:
    """Whatever the tests above did, the O(1) counters agree with a full count of pending jobs."""
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT
                 (SELECT coalesce(sum(pending_jobs), 0) FROM admission_counters
                   WHERE scope = '00000000-0000-0000-0000-000000000000') AS counted,
                 (SELECT count(*) FROM extraction_jobs
                   WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')) AS actual,
                 (SELECT coalesce(sum(pending_bytes), 0) FROM admission_counters
                   WHERE scope = '00000000-0000-0000-0000-000000000000') AS counted_bytes,
                 (SELECT coalesce(sum(doc_bytes), 0) FROM extraction_jobs
                   WHERE state IN ('READY', 'RUNNING', 'RETRY_SCHEDULED')) AS actual_bytes"""
        ).fetchone()
    assert row is not None
    assert row["counted"] == row["actual"]
    assert row["counted_bytes"] == row["actual_bytes"]
