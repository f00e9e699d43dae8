"""Batches through the whole pipeline: the edge, relay, limiter, simulated provider, inference
worker and scheduler, the delivery worker and scheduler, and the reference ERP, as real processes.

Sample invoices run to their real outcomes (some end in review), the batch's counts and state
follow them, and the ERP receives one signed batch.completed.v1 when the last item is final.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import httpx
import pytest

from fix_db import TenantHandle
from fix_pipeline import Pipeline, StartPipeline, sample_text
from fix_processes import ServiceProcess, SpawnFn
from services.acceptance.keys import create_key
from services.common.broker import make_broker
from services.common.procs import free_port
from services.common.settings import CommonSettings
from services.delivery import signing

JSON = dict[str, Any]
BATCH_COMPLETED = "batch.completed.v1"
# The delivery processes' short timers, and the local ERP as an allowed target.
DELIVERY_ENV = {
    "FATURA_EGRESS_ALLOW": "127.0.0.0/8,::1/128",
    "FATURA_DELIVERY_RETRY_SCALE": "0.002",
    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.1",
    "FATURA_DELIVERY_REWAKE_SECONDS": "2",
}


@pytest.fixture(scope="module")
def erp(spawn: SpawnFn, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, str]]:
    secret = signing.new_secret()
    port = free_port()
    db = tmp_path_factory.mktemp("erp") / "erp.sqlite"
    process = spawn("erp", FATURA_ERP_PORT=str(port), FATURA_ERP_DB=str(db), FATURA_ERP_SECRETS=secret)
    process.base_url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{process.base_url}/readyz")
    yield process, secret
    process.stop()


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(**DELIVERY_ENV)
    pipeline.start_processing(delivery=True)
    yield pipeline


@pytest.fixture(scope="module")
def http(pipe: Pipeline) -> Iterator[httpx.Client]:
    with pipe.client() as client:
        yield client


@pytest.fixture
def tenant(pipe: Pipeline, http: httpx.Client, erp: tuple[ServiceProcess, str]) -> TenantHandle:
    """A tenant with the sample suppliers whose webhook endpoint is the reference ERP (default types)."""
    tenant = pipe.make_tenant()
    process, secret = erp
    reply = http.post(
        "/v1/webhook-endpoints",
        json={"url": f"{process.base_url}/webhooks", "secret": secret},
        headers=tenant.headers,
    )
    assert reply.status_code == 201, reply.text
    assert BATCH_COMPLETED in reply.json()["event_types"]
    return tenant


def _submit(http: httpx.Client, tenant: TenantHandle, samples: list[str], key: str) -> str:
    items = [{"document": {"text": sample_text(s), "filename": s}} for s in samples]
    reply = http.post(
        "/v1/extraction-batches", json={"items": items}, headers={**tenant.headers, "Idempotency-Key": key}
    )
    assert reply.status_code == 202, reply.text
    return str(reply.json()["batch_id"])


def _wait_batch(
    http: httpx.Client, tenant: TenantHandle, batch_id: str, until: Any, timeout: float = 90.0
) -> JSON:
    deadline = time.monotonic() + timeout
    while True:
        status: JSON = http.get(f"/v1/extraction-batches/{batch_id}", headers=tenant.headers).json()
        if until(status):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


def _items(http: httpx.Client, tenant: TenantHandle, batch_id: str, **query: str) -> list[JSON]:
    reply = http.get(
        f"/v1/extraction-batches/{batch_id}/items", params={"limit": "200", **query}, headers=tenant.headers
    )
    assert reply.status_code == 200, reply.text
    items: list[JSON] = reply.json()["items"]
    return items


def _batch_deliveries(pipe: Pipeline, batch_id: str, timeout: float = 30.0) -> list[JSON]:
    """The batch event's deliveries once every one has settled."""
    deadline = time.monotonic() + timeout
    while True:
        with pipe.pool.connection() as conn:
            rows = conn.execute(
                """SELECT d.delivery_id, d.state, d.body,
                          (SELECT count(*) FROM delivery_attempts a
                           WHERE a.delivery_id = d.delivery_id) AS attempts
                   FROM deliveries d
                   WHERE d.event_type = %s
                     AND convert_from(d.body, 'UTF8')::jsonb -> 'data' ->> 'batch_id' = %s""",
                (BATCH_COMPLETED, batch_id),
            ).fetchall()
        if rows and all(r["state"] not in ("pending", "delivering") for r in rows):
            return rows
        assert time.monotonic() < deadline, rows
        time.sleep(0.2)


def _erp_receipts(erp: tuple[ServiceProcess, str], webhook_id: str) -> list[JSON]:
    """What the reference ERP's inbox kept for one webhook-id (its receipts table)."""
    process, _ = erp
    db = httpx.get(f"{process.base_url}/admin/stats").json()["db"]
    with sqlite3.connect(f"file:{Path(db)}?mode=ro", uri=True) as conn:
        conn.row_factory = sqlite3.Row
        rows = conn.execute("SELECT * FROM erp_receipts WHERE webhook_id = ?", (webhook_id,)).fetchall()
    return [dict(r) for r in rows]


def test_a_batch_with_a_review_and_a_failure_runs_until_a_reviewer_decides_then_completes_with_errors(
    pipe: Pipeline, http: httpx.Client, tenant: TenantHandle, erp: tuple[ServiceProcess, str]
) -> None:
    # Given a batch of two good invoices, one built to end in review and one that is not an invoice
    samples = ["01_tr_kirtasiye_try.txt", "02_de_buerotechnik_eur.txt", "06_review_bad_arithmetic_try.txt"]
    items = [{"document": {"text": sample_text(s), "filename": s}} for s in samples]
    items.append({"document": {"text": "Dear team, lunch is at noon on Friday.\n"}})
    reply = http.post(
        "/v1/extraction-batches",
        json={"items": items},
        headers={**tenant.headers, "Idempotency-Key": "mixed"},
    )
    assert reply.status_code == 202, reply.text
    batch_id = reply.json()["batch_id"]
    # When the pipeline has done all it can: three items final, one waiting for a reviewer
    status = _wait_batch(http, tenant, batch_id, lambda s: s["counts"]["pending"] == 0)
    # Then the batch is still running, and says why in words
    assert (status["state"], status["done"], status["poll_after_seconds"]) == ("running", False, 60)
    assert status["counts"] == {
        "total": 4,
        "processed": 3,
        "pending": 0,
        "succeeded": 2,
        "review_required": 1,
        "failed": 1,
        "rejected": 0,
        "cancelled": 0,
    }
    assert "wait for a human reviewer" in status["message"] and "Do not report success" in status["message"]
    # And the finished results are readable, the review's result is not
    listed = _items(http, tenant, batch_id)
    assert [i["state"] for i in listed] == ["SUCCEEDED", "SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL"]
    assert listed[0]["result"]["currency"] == "TRY" and listed[1]["result"]["currency"] == "EUR"
    assert "result" not in listed[2] and listed[2]["review"]["reasons"]
    assert listed[3]["error"]["class"]
    assert _items(http, tenant, batch_id, state="errors") == [listed[3]]
    # When a reviewer rejects the one in review
    _, key = create_key(pipe.pool, scope="reviewer", tenant_id=tenant.id, label="batch reviewer")
    reviewer = {"Authorization": f"Bearer {key}"}
    review = next(
        r
        for r in http.get("/v1/reviews", headers=reviewer).json()["reviews"]
        if r["job_id"] == listed[2]["job_id"]
    )
    fence = http.post(f"/v1/reviews/{review['review_id']}:claim", headers=reviewer).json()["fence"]
    decided = http.post(
        f"/v1/reviews/{review['review_id']}:reject",
        json={"fence": fence, "reason": "not ours"},
        headers=reviewer,
    )
    assert decided.status_code == 200, decided.text
    # Then the batch has completed with errors, and the ERP got one signed batch.completed.v1 saying so
    status = _wait_batch(http, tenant, batch_id, lambda s: s["done"])
    assert status["state"] == "completed_with_errors"
    assert (status["counts"]["processed"], status["counts"]["rejected"]) == (4, 1)
    [delivery] = _batch_deliveries(pipe, batch_id)
    assert (delivery["state"], delivery["attempts"]) == ("delivered", 1)
    body = json.loads(bytes(delivery["body"]))
    assert body["type"] == BATCH_COMPLETED
    assert body["data"]["state"] == "completed_with_errors"
    assert body["data"]["counts"] == {
        "total": 4,
        "processed": 4,
        "succeeded": 2,
        "failed": 1,
        "rejected": 1,
        "cancelled": 0,
    }
    assert body["data"]["errors_url"] == f"/v1/extraction-batches/{batch_id}/items?state=errors"
    [receipt] = _erp_receipts(erp, str(delivery["delivery_id"]))
    assert (receipt["event_type"], receipt["job_id"]) == (BATCH_COMPLETED, None)  # not a job's effect


def test_a_batch_of_good_invoices_completes_and_its_event_reaches_the_erp_once_even_when_sent_again(
    pipe: Pipeline, http: httpx.Client, tenant: TenantHandle, erp: tuple[ServiceProcess, str]
) -> None:
    batch_id = _submit(
        http, tenant, ["03_us_supply_usd.txt", "04_uk_office_gbp.txt", "11_fr_papeterie_eur.txt"], "good"
    )
    status = _wait_batch(http, tenant, batch_id, lambda s: s["done"])
    assert (status["state"], status["counts"]["succeeded"]) == ("completed", 3)
    assert status["message"].startswith("Complete: all 3 items")
    [delivery] = _batch_deliveries(pipe, batch_id)
    assert delivery["state"] == "delivered"
    # When the relay's message for the event arrives at delivery a second time (a re-drive)
    with pipe.pool.connection() as conn:
        event = conn.execute(
            """SELECT event_id, payload FROM outbox_events
               WHERE event_type = %s AND payload ->> 'batch_id' = %s""",
            (BATCH_COMPLETED, batch_id),
        ).fetchone()
    assert event is not None
    broker = make_broker(CommonSettings(queue_prefix=pipe.env["FATURA_QUEUE_PREFIX"]))
    try:
        broker.enqueue(
            dramatiq.Message(
                queue_name=f"{pipe.env['FATURA_QUEUE_PREFIX']}.delivery.ingest",
                actor_name="ingest",
                args=(),
                kwargs={"event": event["payload"]},
                options={},
                message_id=str(event["event_id"]),
            )
        )
    finally:
        broker.close()
    time.sleep(2.0)
    # Then there is still one delivery and the ERP holds one receipt for it
    assert [d["delivery_id"] for d in _batch_deliveries(pipe, batch_id)] == [delivery["delivery_id"]]
    assert len(_erp_receipts(erp, str(delivery["delivery_id"]))) == 1


def test_a_finished_batch_no_item_change_closed_is_closed_by_the_relays_sweep(
    pipe: Pipeline, http: httpx.Client
) -> None:
    # Given a batch whose items are all final but which no item change closed (as when its last
    # two items finish at the same instant and neither transaction sees the other's count)
    tenant = pipe.make_tenant()
    batch_id = _submit(http, tenant, ["01_tr_kirtasiye_try.txt"], "unseen")
    assert _wait_batch(http, tenant, batch_id, lambda s: s["done"])["state"] == "completed"
    with pipe.pool.connection() as conn:
        conn.execute(
            "DELETE FROM outbox_events WHERE event_type = %s AND payload ->> 'batch_id' = %s",
            (BATCH_COMPLETED, batch_id),
        )
        conn.execute(
            "UPDATE extraction_batches SET state = 'running', completed_at = NULL WHERE id = %s", (batch_id,)
        )
    # Then the relay's sweep closes it within a sweep and writes its event once
    status = _wait_batch(http, tenant, batch_id, lambda s: s["done"], timeout=10.0)
    assert status["state"] == "completed" and status["completed_at"] is not None
    with pipe.pool.connection() as conn:
        count = conn.execute(
            "SELECT count(*) AS n FROM outbox_events WHERE event_type = %s AND payload ->> 'batch_id' = %s",
            (BATCH_COMPLETED, batch_id),
        ).fetchone()
    assert count == {"n": 1}
