"""The accept fast path's admission counters on real PostgreSQL: requests that find this worker's
cached counters stale share one read of them, and a tenant near a limit still goes the careful way
(a fresh read) and is refused."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from dataclasses import replace

import pytest

from fix_db import SyncPool
from services.acceptance import admission
from services.acceptance.accept import Accepted, Acceptor
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common.api.errors import ApiError
from services.common.api.tenancy import Tenant, TenantLimits
from services.common.db import async_pool
from services.common.settings import CommonSettings


class CountingAcceptor(Acceptor):
    """The real Acceptor, counting its reads of the admission counters."""

    reads = 0

    async def _read_usage(self, tenant_id: uuid.UUID) -> admission.Usage:
        self.reads += 1
        return await super()._read_usage(tenant_id)


@pytest.fixture
def tenant_id(unpublished_tenant_id: uuid.UUID) -> uuid.UUID:
    return unpublished_tenant_id


def _job(text: str) -> CreateJob:
    data = text.encode()
    document = DocumentBody(text, "inv.txt", len(data), hashlib.sha256(data).hexdigest())
    return CreateJob(document, "invoice.v1", "batch", 3600, {})


def _tenant(tenant_id: uuid.UUID, max_pending_jobs: int) -> Tenant:
    limits = TenantLimits(
        max_pending_jobs=max_pending_jobs,
        max_pending_bytes=10**12,
        max_pending_tokens=10**12,
        daily_token_budget=10**12,
    )
    return Tenant(tenant_id, "t", 1, 10, limits)


async def _accept_all(
    pool_url: str, tenant: Tenant, n: int, cache_seconds: float, one_by_one: bool = False
) -> tuple[int, list[object]]:
    common = CommonSettings(database_url=pool_url)
    settings = replace(AcceptanceSettings(common=common), admission_cache_seconds=cache_seconds)
    pool = async_pool(settings.common, name="counters-test", max_size=8, autocommit=True)
    await pool.open()
    try:
        acceptor = CountingAcceptor(pool, None, settings)
        calls = [acceptor.accept(tenant, f"key-{uuid.uuid4()}", _job(f"invoice {i}")) for i in range(n)]
        results: list[object] = []
        if one_by_one:
            for call in calls:
                try:
                    results.append(await call)
                except ApiError as exc:
                    results.append(exc)
        else:
            results = list(await asyncio.gather(*calls, return_exceptions=True))
        return acceptor.reads, results
    finally:
        await pool.close()


def test_requests_finding_the_counters_stale_share_one_read(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    # Given a worker whose cache holds no counters for a tenant far from its limits
    tenant = _tenant(tenant_id, max_pending_jobs=10_000)
    # When twenty jobs arrive at once
    reads, results = asyncio.run(_accept_all(pool.conninfo, tenant, 20, cache_seconds=10.0))
    # Then all are accepted, after one read of the counters between them
    assert all(isinstance(r, Accepted) and not r.replay for r in results), results
    assert reads == 1


def test_a_tenant_near_its_limit_is_refused_on_fresh_counters(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    # Given a tenant allowed three pending jobs, and a worker caching its counters for 10 s
    tenant = _tenant(tenant_id, max_pending_jobs=3)
    # When four jobs arrive one after another
    _, results = asyncio.run(_accept_all(pool.conninfo, tenant, 4, cache_seconds=10.0, one_by_one=True))
    # Then three are accepted and the fourth is refused with 429
    assert [isinstance(r, Accepted) for r in results] == [True, True, True, False], results
    refused = results[3]
    assert isinstance(refused, ApiError) and refused.status == 429, refused
