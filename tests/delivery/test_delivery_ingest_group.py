"""The delivery worker's ingest threads write their inbox rows and deliveries in shared transactions
(services/common/groupcommit.py): a backlog of completion events is taken in with fewer
transactions than events, and every event still makes its one delivery, sent once."""

from __future__ import annotations

import re
import uuid

import httpx

from fix_db import SyncPool
from fix_delivery import Erp, Jobs, RegisterFn, StartProcess, settled, wait_for
from fix_processes import ServiceProcess


def _group_commit(worker: ServiceProcess, sample: str) -> float:
    text = httpx.get(f"{worker.base_url}/metrics", timeout=5).text
    name = f"fatura_group_commit_writes_{sample}"
    found = re.search(rf'^{name}\{{group="delivery_inbox"\}} (\S+)$', text, re.MULTILINE)
    assert found, f"{name} is not in the worker's metrics"
    return float(found.group(1))


def test_a_backlog_of_completion_events_is_taken_in_several_to_a_transaction_and_each_sent_once(
    start_worker: StartProcess,
    scheduler: ServiceProcess,
    erp: Erp,
    register: RegisterFn,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    # Given 30 finished jobs whose completion events wait in the ingest queue while no worker runs
    endpoint = register(erp.webhook_url)
    job_ids: list[uuid.UUID] = [jobs.submit(endpoint.tenant) for _ in range(30)]
    for job_id in job_ids:
        jobs.complete(endpoint.tenant, job_id)
    # When a delivery worker starts (its default threads) and takes them in
    worker = start_worker()
    # Then every job's result reaches the ERP once
    for job_id in job_ids:
        assert settled(dclient, endpoint.tenant, job_id, timeout=60)["state"] == "delivered"
        assert wait_for(lambda j=job_id: erp.ledger(j), 20, "the ERP ledger entry")["effects"] == 1
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS events, count(DISTINCT job_id) AS jobs FROM delivery_inbox"
            " WHERE job_id = ANY(%s)",
            (job_ids,),
        ).fetchone()
    assert row is not None and (row["events"], row["jobs"]) == (30, 30)
    # And the events were written in fewer transactions than events (the queue is this run's, so
    # events other tests left in it may be among them)
    written = _group_commit(worker, "sum")
    assert written >= 30
    assert _group_commit(worker, "count") < written
