"""Database fixtures: a fresh, migrated test database per run, a pool on it, and tenant factories."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.acceptance.accept import plan_job, write_params
from services.acceptance.queries import Q as ACCEPT_Q
from services.acceptance.requests import DocumentBody, RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.db import SyncPool, sync_pool
from services.common.migrate import migrate
from services.common.settings import CommonSettings

# Each run gets a database of its own, so several runs on one machine never see each other's rows.
BASE_URL = os.environ.get(
    "FATURA_TEST_DATABASE_URL", f"postgresql://postgres@127.0.0.1:5432/fatura_test_{uuid.uuid4().hex[:8]}"
)


def recreate_database(url: str) -> str:
    """Drop and create the database named in ``url``; returns ``url``."""
    name = str(conninfo_to_dict(url)["dbname"])
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return url


def drop_database(url: str) -> None:
    name = str(conninfo_to_dict(url)["dbname"])
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def database_of_its_own(
    database_url: str, suffix: str, *, max_size: int = 2
) -> Iterator[tuple[str, SyncPool]]:
    """A fresh, migrated database beside the run's (its name and ``_suffix``), with a pool named
    ``suffix`` on it: no other module's session or process uses it. Dropped afterwards."""
    url = recreate_database(f"{database_url}_{suffix}")
    try:
        migrate(url)
        with sync_pool(CommonSettings(database_url=url), name=suffix, max_size=max_size) as pool:
            yield url, pool
    finally:
        drop_database(url)


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    url = recreate_database(BASE_URL)
    migrate(url)
    yield url
    if "FATURA_TEST_DATABASE_URL" not in os.environ:
        drop_database(url)


@pytest.fixture(scope="session")
def common_settings(database_url: str, queue_prefix: str) -> CommonSettings:
    return CommonSettings(database_url=database_url, queue_prefix=queue_prefix)


@pytest.fixture(scope="session")
def pool(common_settings: CommonSettings) -> Iterator[SyncPool]:
    with sync_pool(common_settings, name="tests", max_size=4) as p:
        yield p


@dataclass(frozen=True)
class TenantHandle:
    id: uuid.UUID
    api_key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}


MakeTenant = Callable[..., TenantHandle]


@pytest.fixture
def make_tenant(pool: SyncPool) -> MakeTenant:
    """Create a tenant with the given limits (the rest default high)."""

    def make(**limits: Any) -> TenantHandle:
        spec = TenantSpec(name=f"t-{uuid.uuid4().hex[:8]}", **limits)
        tenant_id, key = create_tenant(pool, spec)
        return TenantHandle(tenant_id, key)

    return make


@pytest.fixture(scope="module")
def make_tenant_module(pool: SyncPool) -> MakeTenant:
    """``make_tenant`` for module-scoped fixtures."""

    def make(**limits: Any) -> TenantHandle:
        tenant_id, key = create_tenant(pool, TenantSpec(name=f"t-{uuid.uuid4().hex[:8]}", **limits))
        return TenantHandle(tenant_id, key)

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., TenantHandle]) -> TenantHandle:
    return make_tenant()


@pytest.fixture
def unpublished_tenant_id(pool: SyncPool, make_tenant: MakeTenant) -> Iterator[uuid.UUID]:
    """A tenant whose jobs' events no relay of a later test publishes: for tests that accept jobs
    through the Acceptor alone, whose jobs go nowhere."""
    made = make_tenant().id
    yield made
    with pool.connection() as conn:
        conn.execute(
            """UPDATE outbox_events SET published_at = now()
               WHERE published_at IS NULL
                 AND job_id IN (SELECT id FROM extraction_jobs WHERE tenant_id = %s)""",
            (made,),
        )


def accept_by_statement(
    conn: psycopg.Connection[Any],
    tenant_id: uuid.UUID,
    key: str,
    *,
    batch: tuple[uuid.UUID, int] | None = None,
) -> uuid.UUID:
    """A job with a small inline invoice written by the acceptance statement alone, on ``conn``
    (in its transaction, or its own when autocommit); with ``batch``, as that batch's item of that
    index. The new job's id."""
    settings = AcceptanceSettings()
    job = RequestParser(settings).create_job({"document": {"text": f"Invoice {key}\nTotal: 1.00 EUR"}})
    assert isinstance(job.document, DocumentBody)
    plan = plan_job(settings, tenant_id, key, job, job.document.size_bytes, job.document.sha256)
    job_id = uuid.uuid4()
    batch_id, index = batch if batch else (None, None)
    params = write_params(settings, tenant_id, key, job, plan, job_id, batch_id=batch_id, batch_index=index)
    assert conn.execute(ACCEPT_Q["accept_job"], params).fetchone()
    return job_id


def tenant_jobs(pool: SyncPool, tenant_id: uuid.UUID) -> list[dict[str, Any]]:
    """The tenant's jobs: idempotency key, id, the transaction that wrote the row (``xid``) and how
    many outbox events it has."""
    with pool.connection() as conn:
        return conn.execute(
            """SELECT j.idempotency_key, j.id, j.xmin::text AS xid,
                      (SELECT count(*) FROM outbox_events o WHERE o.job_id = j.id) AS outbox
               FROM extraction_jobs j WHERE j.tenant_id = %s""",
            (tenant_id,),
        ).fetchall()


def count_rows(pool: SyncPool, tenant_id: uuid.UUID) -> dict[str, int]:
    """How many rows a tenant has in each table a request may write."""
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT
                 (SELECT count(*) FROM extraction_jobs WHERE tenant_id = %(t)s) AS jobs,
                 (SELECT count(*) FROM documents WHERE tenant_id = %(t)s) AS documents,
                 (SELECT count(*) FROM outbox_events WHERE tenant_id = %(t)s) AS outbox,
                 (SELECT count(*) FROM job_events WHERE tenant_id = %(t)s) AS job_events""",
            {"t": tenant_id},
        ).fetchone()
    assert row is not None
    return {k: int(v) for k, v in row.items()}


def buffers_touched(pool: SyncPool, query: str, params: dict[str, Any], *, after: str | None = None) -> int:
    """The shared buffers ``query`` touches, run under EXPLAIN ANALYZE (after the statement
    ``after`` names, such as a SET LOCAL, in the same transaction), all of it rolled back."""
    with pool.connection() as conn, conn.transaction():
        if after is not None:
            conn.execute(after)
        row = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query, params).fetchone()
        assert row is not None
        plan: dict[str, Any] = row["QUERY PLAN"][0]["Plan"]
        raise psycopg.Rollback  # EXPLAIN ANALYZE ran the statement: nothing of it stays
    return int(plan["Shared Hit Blocks"]) + int(plan.get("Shared Read Blocks", 0))
