"""The accept statement's cursor kept per connection (``db.statement_cursor``) on real PostgreSQL:
one connection accepts job after job through the same cursor, answers a replay as a replay, and
keeps working after a statement on it failed; another connection has a cursor of its own."""

from __future__ import annotations

import asyncio
import hashlib
import uuid

import psycopg
import pytest

from fix_db import SyncPool
from services.acceptance.accept import Accepted, Acceptor
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common.api.tenancy import Tenant, TenantLimits
from services.common.db import async_pool, statement_cursor
from services.common.settings import CommonSettings


@pytest.fixture
def tenant_id(unpublished_tenant_id: uuid.UUID) -> uuid.UUID:
    return unpublished_tenant_id


def _job(text: str, filename: str | None = "inv.txt") -> CreateJob:
    data = text.encode()
    document = DocumentBody(text, filename, len(data), hashlib.sha256(data).hexdigest())
    return CreateJob(document, "invoice.v1", "batch", 3600, {})


def _tenant(tenant_id: uuid.UUID) -> Tenant:
    limits = TenantLimits(
        max_pending_jobs=10**6, max_pending_bytes=10**12, max_pending_tokens=10**12, daily_token_budget=10**12
    )
    return Tenant(tenant_id, "t", 1, 10, limits)


async def _scenario(url: str, tenant: Tenant) -> None:
    settings = AcceptanceSettings(common=CommonSettings(database_url=url))
    pool = async_pool(settings.common, name="statement-cursor-test", max_size=1, autocommit=True)
    await pool.open()
    try:
        acceptor = Acceptor(pool, None, settings)
        # Given one connection, accepting jobs one after another (parameters of changing types)
        keys = [f"key-{uuid.uuid4()}" for _ in range(12)]
        accepted = [
            await acceptor.accept(tenant, key, _job(f"invoice {i}", None if i % 3 else "inv.txt"))
            for i, key in enumerate(keys)
        ]
        async with pool.connection() as conn:
            cursor = statement_cursor(conn, "accept_job")
            # When a statement on its cursor fails
            with pytest.raises(psycopg.errors.DivisionByZero):
                await cursor.execute("SELECT 1 / 0")
        # Then the connection still accepts new jobs and answers a replay as a replay, through the
        # one cursor it keeps for the statement
        again = await acceptor.accept(tenant, keys[0], _job("invoice 0", "inv.txt"))
        fresh = await acceptor.accept(tenant, f"key-{uuid.uuid4()}", _job("invoice new"))
        async with pool.connection() as conn:
            assert statement_cursor(conn, "accept_job") is cursor
            assert statement_cursor(conn, "other") is not cursor
        assert all(isinstance(a, Accepted) and not a.replay for a in accepted)
        assert len({a.body["job_id"] for a in accepted}) == len(keys)
        assert again.replay and again.body["job_id"] == accepted[0].body["job_id"]
        assert not fresh.replay and fresh.body["job_id"] not in {a.body["job_id"] for a in accepted}
        # And another connection has a cursor of its own, which a closed one is replaced by
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as other:
            mine = statement_cursor(other, "accept_job")
            assert mine is not cursor
            await mine.close()
            assert statement_cursor(other, "accept_job") is not mine
    finally:
        await pool.close()


def test_one_connection_accepts_through_the_cursor_it_keeps(pool: SyncPool, tenant_id: uuid.UUID) -> None:
    asyncio.run(_scenario(pool.conninfo, _tenant(tenant_id)))
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT count(*) AS jobs,
                      (SELECT count(*) FROM outbox_events o JOIN extraction_jobs j ON j.id = o.job_id
                       WHERE j.tenant_id = %(t)s) AS events
               FROM extraction_jobs WHERE tenant_id = %(t)s""",
            {"t": tenant_id},
        ).fetchone()
    assert row is not None and (row["jobs"], row["events"]) == (13, 13)
