"""The fast path's group commit (services/acceptance/group_write.py) on real PostgreSQL: accepts
that queue while a write is under way share the next transaction, each answered only once its job
is committed; a write the database refuses fails alone; two requests with one key in one group make
one job; a connection lost mid-group fails the whole group, and the clients' retries with the same
keys make each job exactly once; a real edge reports its groups on /metrics."""

from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest

from fix_api import job_body
from fix_db import MakeTenant, SyncPool, tenant_jobs
from fix_processes import SpawnFn, start_edge
from services.acceptance.accept import Accepted, Acceptor
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common.api.tenancy import Tenant, TenantLimits
from services.common.db import async_pool
from services.common.settings import CommonSettings

POOL_NAME = "group-write-test"


@pytest.fixture
def tenant(unpublished_tenant_id: uuid.UUID) -> Tenant:
    limits = TenantLimits(
        max_pending_jobs=10**6, max_pending_bytes=10**12, max_pending_tokens=10**12, daily_token_budget=10**12
    )
    return Tenant(unpublished_tenant_id, "t", 1, 10, limits)


def _job(text: str, priority: str = "batch") -> CreateJob:
    data = text.encode()
    return CreateJob(
        DocumentBody(text, "inv.txt", len(data), hashlib.sha256(data).hexdigest()),
        "invoice.v1",
        priority,
        3600,
        {},
    )


def _run(url: str, scenario: Any, *, group_max: int = 32) -> Any:
    """``scenario(acceptor, pool)`` with an Acceptor of one writer on a pool of one connection."""

    async def main() -> Any:
        settings = AcceptanceSettings(
            common=CommonSettings(database_url=url), accept_writers=1, accept_group_max=group_max
        )
        pool = async_pool(settings.common, name=POOL_NAME, max_size=1, autocommit=True)
        await pool.open()
        try:
            return await scenario(Acceptor(pool, None, settings), pool)
        finally:
            await pool.close()

    return asyncio.run(main())


def _jobs(pool: SyncPool, tenant: Tenant) -> dict[str, dict[str, Any]]:
    """The tenant's jobs by idempotency key: id, the transaction that wrote it, its outbox events."""
    return {r["idempotency_key"]: r for r in tenant_jobs(pool, tenant.id)}


async def _visible(url: str, job_ids: list[str]) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*) FROM extraction_jobs WHERE id = ANY(%s::uuid[])", (job_ids,)
        )
        row = await cur.fetchone()
        return int(row[0]) if row else 0


def _accept_all(url: str, tenant: Tenant, keys: list[str], *, group_max: int = 32) -> list[Accepted]:
    async def scenario(acceptor: Acceptor, pool: Any) -> list[Accepted]:
        async def one(i: int, key: str) -> Accepted:
            accepted = await acceptor.accept(tenant, key, _job(f"invoice {i}"))
            # The moment its answer is ready, the job is committed: another session sees it.
            assert await _visible(url, [accepted.body["job_id"]]) == 1
            return accepted

        return list(await asyncio.gather(*(one(i, k) for i, k in enumerate(keys))))

    result: list[Accepted] = _run(url, scenario, group_max=group_max)
    return result


def test_concurrent_accepts_share_transactions_and_each_answer_follows_its_commit(
    pool: SyncPool, tenant: Tenant
) -> None:
    # Given 40 requests at once on one writer and one connection
    keys = [f"k-{uuid.uuid4()}" for _ in range(40)]
    # When they are accepted
    accepted = _accept_all(pool.conninfo, tenant, keys)
    # Then each is a new job, stored once with its outbox event, answered after its commit
    assert not any(a.replay for a in accepted)
    assert len({a.body["job_id"] for a in accepted}) == 40
    stored = _jobs(pool, tenant)
    assert sorted(stored) == sorted(keys)
    assert {str(stored[k]["id"]) for k in keys} == {a.body["job_id"] for a in accepted}
    assert all(r["outbox"] == 1 for r in stored.values())
    # And the writes that queued behind the first shared transactions: fewer commits than jobs
    assert len({r["xid"] for r in stored.values()}) < 40


def test_with_groups_of_one_every_job_has_its_own_transaction(pool: SyncPool, tenant: Tenant) -> None:
    # Given grouping turned off (FATURA_ACCEPT_GROUP_MAX=1)
    keys = [f"k-{uuid.uuid4()}" for _ in range(20)]
    accepted = _accept_all(pool.conninfo, tenant, keys, group_max=1)
    # Then every job was committed by a transaction of its own
    stored = _jobs(pool, tenant)
    assert len(accepted) == len(stored) == 20
    assert len({r["xid"] for r in stored.values()}) == 20


def test_a_write_the_database_refuses_fails_alone(pool: SyncPool, tenant: Tenant) -> None:
    # Given 20 requests at once, one of them carrying a priority the table's CHECK refuses
    keys = [f"k-{uuid.uuid4()}" for _ in range(20)]
    bad = keys[7]

    async def scenario(acceptor: Acceptor, _: Any) -> list[Accepted | BaseException]:
        calls = [
            acceptor.accept(tenant, k, _job(f"invoice {i}", "urgent" if k == bad else "batch"))
            for i, k in enumerate(keys)
        ]
        return list(await asyncio.gather(*calls, return_exceptions=True))

    results = _run(pool.conninfo, scenario)
    # Then that request alone fails, with the database's refusal, and writes nothing
    refused = [r for r in results if isinstance(r, BaseException)]
    assert len(refused) == 1 and isinstance(refused[0], psycopg.errors.CheckViolation)
    assert results[7] is refused[0]
    # And the 19 others are accepted and stored once each
    stored = _jobs(pool, tenant)
    assert sorted(stored) == sorted(k for k in keys if k != bad)
    assert all(isinstance(r, Accepted) and not r.replay for i, r in enumerate(results) if i != 7)


def test_one_key_twice_in_a_group_makes_one_job(pool: SyncPool, tenant: Tenant) -> None:
    # Given two identical requests with the same key among others, all at once
    key = f"k-{uuid.uuid4()}"
    others = [f"k-{uuid.uuid4()}" for _ in range(10)]

    async def scenario(acceptor: Acceptor, _: Any) -> list[Accepted]:
        calls: list[Awaitable[Accepted]] = [acceptor.accept(tenant, k, _job(k)) for k in others[:5]]
        calls += [acceptor.accept(tenant, key, _job("same")), acceptor.accept(tenant, key, _job("same"))]
        calls += [acceptor.accept(tenant, k, _job(k)) for k in others[5:]]
        return list(await asyncio.gather(*calls))

    results = _run(pool.conninfo, scenario)
    first, second = results[5], results[6]
    # Then one job: one answer is the new job, the other its replay
    assert first.body["job_id"] == second.body["job_id"]
    assert sorted([first.replay, second.replay]) == [False, True]
    stored = _jobs(pool, tenant)
    assert len(stored) == 11 and str(stored[key]["id"]) == first.body["job_id"]


def test_a_connection_lost_mid_group_fails_the_group_and_retries_make_each_job_once(
    pool: SyncPool, tenant: Tenant
) -> None:
    keys = [f"k-{uuid.uuid4()}" for _ in range(12)]
    url = pool.conninfo

    async def scenario(acceptor: Acceptor, _: Any) -> list[Accepted | BaseException]:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as admin:
            # Given a group whose writes wait on a lock another session holds
            async with admin.transaction():
                await admin.execute("LOCK TABLE documents IN SHARE ROW EXCLUSIVE MODE")
                calls = [
                    asyncio.ensure_future(acceptor.accept(tenant, k, _job(f"invoice {i}")))
                    for i, k in enumerate(keys)
                ]
                pid = await _waiting_backend(admin)
                # When the group's connection is cut while its transaction is under way
                await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            return list(await asyncio.gather(*calls, return_exceptions=True))

    results = _run(url, scenario)
    # Then every request of the cut transaction fails with a connection error (a 503 at the edge)
    failed = [r for r in results if isinstance(r, BaseException)]
    assert failed and all(isinstance(e, psycopg.OperationalError) for e in failed)
    before = _jobs(pool, tenant)
    assert len(before) == len(keys) - len(failed)  # the failed ones wrote nothing

    # And when the clients retry with the same keys, each job exists exactly once
    retried = _accept_all(url, tenant, keys)
    stored = _jobs(pool, tenant)
    assert sorted(stored) == sorted(keys)
    assert {str(stored[k]["id"]) for k in keys} == {a.body["job_id"] for a in retried}


async def _waiting_backend(admin: psycopg.AsyncConnection[Any]) -> int:
    """The pid of the test pool's session once it waits on the lock (with writes queued behind).
    The deadline is generous: on a loaded machine the pool's first connections can take seconds."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        cur = await admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            (f"fatura-{POOL_NAME}",),
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("the group's session never waited on the lock")


def test_the_edge_reports_its_write_groups_on_metrics(spawn: SpawnFn, make_tenant: MakeTenant) -> None:
    # Given an edge with one writer per process, and 40 submissions at once
    edge = start_edge(spawn, workers=1, FATURA_ACCEPT_WRITERS="1")
    try:
        tenant = make_tenant()
        with httpx.Client(base_url=edge.base_url or "", timeout=30) as client:

            def post(n: int) -> int:
                headers = {**tenant.headers, "Idempotency-Key": f"m-{n}-{uuid.uuid4()}"}
                return client.post("/v1/extraction-jobs", json=job_body(), headers=headers).status_code

            with ThreadPoolExecutor(max_workers=40) as threads:
                assert list(threads.map(post, range(40))) == [202] * 40
            page = httpx.get(
                f"http://127.0.0.1:{edge.env['FATURA_HTTP_METRICS_PORT']}/metrics", timeout=10
            ).text
    finally:
        edge.stop()
    # Then /metrics counts the 40 writes in the accept group's histogram, in fewer transactions
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("fatura_group_commit_writes_")
        and 'group="accept"' in line
        and "_bucket" not in line
    }
    assert values["fatura_group_commit_writes_sum"] == 40
    assert 1 <= values["fatura_group_commit_writes_count"] < 40
