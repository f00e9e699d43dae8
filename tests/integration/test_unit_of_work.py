"""The unit of work writes a row change, its job event and its outbox event together or not at all."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from fix_api import SubmitFn
from fix_db import SyncPool, TenantHandle
from services.common import events, states
from services.common.uow import JobChange, unit_of_work

_BUMP = "UPDATE extraction_jobs SET state = 'RUNNING', state_version = 2 WHERE id = %(id)s"


def _snapshot(pool: SyncPool, job_id: uuid.UUID) -> tuple[str, int, int]:
    with pool.connection() as conn:
        row = conn.execute(
            """SELECT j.state,
                      (SELECT count(*) FROM job_events WHERE job_id = j.id) AS events,
                      (SELECT count(*) FROM outbox_events WHERE job_id = j.id) AS outbox
               FROM extraction_jobs j WHERE j.id = %s""",
            (job_id,),
        ).fetchone()
    assert row is not None
    return row["state"], row["events"], row["outbox"]


def _change(tenant: TenantHandle, job_id: uuid.UUID) -> JobChange:
    return JobChange(tenant.id, job_id, states.RUNNING, 2, events.EXTRACTION_CANCELLED)


def test_an_error_inside_the_unit_of_work_leaves_nothing_behind(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    job_id = uuid.UUID(submit(tenant).json()["job_id"])

    with pytest.raises(RuntimeError), unit_of_work(pool) as uow:
        uow.execute(_BUMP, {"id": job_id})
        uow.record(_change(tenant, job_id))
        raise RuntimeError("the caller failed after writing")

    assert _snapshot(pool, job_id) == ("READY", 1, 1)


def test_a_duplicate_state_version_rolls_back_the_row_change_too(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    """Every change must bump state_version: recording version 1 twice is refused as a whole."""
    job_id = uuid.UUID(submit(tenant).json()["job_id"])

    with pytest.raises(psycopg.errors.UniqueViolation), unit_of_work(pool) as uow:
        uow.execute(_BUMP, {"id": job_id})
        uow.record(JobChange(tenant.id, job_id, states.RUNNING, 1, events.EXTRACTION_CANCELLED))

    assert _snapshot(pool, job_id) == ("READY", 1, 1)


def test_a_clean_unit_of_work_commits_all_three_and_wakes_the_relay(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool, database_url: str
) -> None:
    job_id = uuid.UUID(submit(tenant).json()["job_id"])
    time.sleep(0.2)  # let the edge's own wake-up for this submission pass first
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute("LISTEN fatura_outbox")

        with unit_of_work(pool) as uow:
            uow.execute(_BUMP, {"id": job_id})
            uow.record(_change(tenant, job_id))

        woken = list(listener.notifies(timeout=5, stop_after=1))
    assert _snapshot(pool, job_id) == ("RUNNING", 2, 2)
    assert [n.channel for n in woken][:1] == ["fatura_outbox"]
