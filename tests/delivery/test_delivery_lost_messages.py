"""Lost messages on the delivery side strand no webhook: the delivery scheduler finds in the database
what a lost message would leave behind and drives it again (DESIGN §5.12)."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator

import httpx
import pytest

from fix_db import SyncPool
from fix_delivery import DELIVERY_ENV, Erp, Jobs, RegisterFn, settled, wait_for
from fix_processes import ServiceProcess, SpawnFn
from services.common.messages import parse_event
from services.common.procs import free_port
from services.delivery import payload, store


@pytest.fixture(scope="module")
def scheduler(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    """This module's delivery scheduler reconciles after one second instead of a minute."""
    port = free_port()
    process = spawn(
        "delivery-scheduler",
        FATURA_DELIVERY_SCHEDULER_METRICS_PORT=str(port),
        FATURA_RECONCILE_GRACE_SECONDS="1",
        **DELIVERY_ENV,
    )
    process.base_url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{process.base_url}/readyz")
    yield process
    process.stop()


def _redriven(scheduler: ServiceProcess, kind: str) -> float:
    text = httpx.get(f"{scheduler.base_url}/metrics", timeout=5).text
    match = re.search(rf'^fatura_reconciler_redriven_total\{{kind="{kind}"\}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def test_a_completion_event_whose_message_was_lost_still_reaches_the_erp_once(
    worker: ServiceProcess,
    scheduler: ServiceProcess,
    erp: Erp,
    register: RegisterFn,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    # Given a finished job whose completion event the relay published, and whose message was lost
    # on the way (it never reached the delivery ingest queue)
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    before = _redriven(scheduler, "completion_event")
    jobs.complete(endpoint.tenant, job_id, publish=False)
    # Then the reconciler finds a published event the delivery inbox never recorded, publishes it
    # again, and the ERP applies the result once
    delivery = settled(dclient, endpoint.tenant, job_id, timeout=30)
    assert delivery["state"] == "delivered"
    entry = wait_for(lambda: erp.ledger(job_id), 20, "the ERP ledger entry")
    assert entry["effects"] == 1
    assert _redriven(scheduler, "completion_event") >= before + 1
    with pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM delivery_inbox WHERE job_id = %s", (job_id,)).fetchone()
    assert row is not None and row["n"] == 1


def test_a_delivery_whose_wake_up_was_lost_is_woken_again_and_sent(
    worker: ServiceProcess,
    scheduler: ServiceProcess,
    erp: Erp,
    register: RegisterFn,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    # Given a delivery committed by the ingest, whose deliver wake-up was lost between the commit and
    # the publish (the ingest's own function, without the publish that follows it)
    endpoint = register(erp.webhook_url)
    job_id = jobs.submit(endpoint.tenant)
    before = _redriven(scheduler, "delivery_wakeup")
    event = jobs.complete(endpoint.tenant, job_id, publish=False)
    event_id = uuid.UUID(event["event_id"])
    with pool.connection() as conn:  # out of the reconciler's window: only the lost wake-up is left
        conn.execute(
            "UPDATE outbox_events SET published_at = now() - interval '2 hours' WHERE event_id = %s",
            (event_id,),
        )
    woken = store.ingest(pool, parse_event(event, payload.EVENT_TYPES))
    assert len(woken) == 1
    # Then the scheduler wakes it again once its wake-up is overdue, and the ERP applies it once
    delivery = settled(dclient, endpoint.tenant, job_id, timeout=30)
    assert delivery["state"] == "delivered"
    assert wait_for(lambda: erp.ledger(job_id), 20, "the ERP ledger entry")["effects"] == 1
    assert _redriven(scheduler, "delivery_wakeup") >= before + 1
