"""Several inference schedulers at once, as real processes on one database: every expired lease is
reaped once and every overdue job failed once, never twice."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest

from fix_amqp import delete_queues
from fix_db import database_of_its_own
from fix_processes import SpawnFn
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.db import SyncPool
from services.common.procs import free_port


@pytest.fixture
def scratch(database_url: str) -> Iterator[tuple[str, SyncPool]]:
    with database_of_its_own(database_url, "sched") as scratch:
        yield scratch


def _insert_jobs(pool: SyncPool, tenant_id: uuid.UUID, count: int, state: str, sql_after: str) -> None:
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
                policy_version, model_policy, priority, state, deadline_at)
            SELECT gen_random_uuid(), %(t)s, %(s)s || g, 'h', %(d)s, 1, 'v1', 1, 10, 'invoice.v1', 'p',
                   'default', 'batch', 'READY', now() + interval '1 day'
            FROM generate_series(1, %(n)s) AS g
            """,
            {"t": tenant_id, "n": count, "d": doc_id, "s": state},
        )
        conn.execute(sql_after, {"t": tenant_id})


def test_several_schedulers_reap_each_expired_lease_and_fail_each_overdue_job_exactly_once(
    scratch: tuple[str, SyncPool], spawn: SpawnFn
) -> None:
    url, pool = scratch
    tenant, _ = create_tenant(pool, TenantSpec(name="sched"))
    # Given 150 running jobs whose worker died (lease expired) and 150 jobs past their deadline
    _insert_jobs(
        pool,
        tenant,
        150,
        "running-",
        "UPDATE extraction_jobs SET state = 'RUNNING', state_version = 2, attempt = 1, fence = 1,"
        " lease_until = now() - interval '1 second', claimed_by = 'dead'"
        " WHERE idempotency_key LIKE 'running-%%'",
    )
    _insert_jobs(
        pool,
        tenant,
        150,
        "overdue-",
        "UPDATE extraction_jobs SET deadline_at = now() - interval '1 second'"
        " WHERE idempotency_key LIKE 'overdue-%%'",
    )
    # When three schedulers run at once with small batches
    schedulers = []
    prefix = f"sched-{uuid.uuid4().hex[:6]}"
    for _ in range(3):
        port = free_port()
        scheduler = spawn(
            "inference-scheduler",
            FATURA_DATABASE_URL=url,
            FATURA_SCHEDULER_METRICS_PORT=str(port),
            FATURA_SCHEDULER_INTERVAL_SECONDS="0.05",
            FATURA_SCHEDULER_BATCH="10",
            FATURA_QUEUE_PREFIX=prefix,
        )
        schedulers.append((scheduler, port))
    for scheduler, port in schedulers:
        scheduler.wait_ready(f"http://127.0.0.1:{port}/readyz")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with pool.connection() as conn:
            left = conn.execute(
                "SELECT count(*) AS n FROM extraction_jobs WHERE (state = 'RUNNING') OR"
                " (idempotency_key LIKE 'overdue-%%' AND state <> 'FAILED_TERMINAL')"
            ).fetchone()
        if left is not None and left["n"] == 0:
            break
        time.sleep(0.2)
    for scheduler, _ in schedulers:
        scheduler.stop()
    delete_queues(prefix)
    # Then each job was handled once: one version step, one attempt row, one event, one outbox row
    with pool.connection() as conn:
        reaped = conn.execute(
            "SELECT state, state_version, fence, attempt,"
            " (SELECT count(*) FROM job_attempts a WHERE a.job_id = j.id) AS attempt_rows,"
            " (SELECT count(*) FROM job_events e WHERE e.job_id = j.id) AS events"
            " FROM extraction_jobs j WHERE idempotency_key LIKE 'running-%%'"
        ).fetchall()
        overdue = conn.execute(
            "SELECT state, state_version, error_class,"
            " (SELECT count(*) FROM outbox_events o WHERE o.job_id = j.id) AS published"
            " FROM extraction_jobs j WHERE idempotency_key LIKE 'overdue-%%'"
        ).fetchall()
    assert len(reaped) == 150
    assert {(r["state"], r["state_version"], r["fence"], r["attempt"]) for r in reaped} == {
        ("RETRY_SCHEDULED", 3, 2, 1)
    }
    assert {(r["attempt_rows"], r["events"]) for r in reaped} == {(1, 1)}
    assert {(r["state"], r["state_version"], r["error_class"], r["published"]) for r in overdue} == {
        ("FAILED_TERMINAL", 2, "deadline_exceeded", 1)
    }
