"""The ERP's business acknowledgement (DESIGN §5.13): a delivery answered 2xx is received; the ERP's
signed ``POST /v1/deliveries/{id}:ack`` says posted or rejected. The edge, the delivery worker and
scheduler, a test receiver and the reference ERP run as real processes; acknowledgements are sent
with the partner SDK, as an ERP would."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fatura_sdk import ack_request, acknowledge, sign_headers
from fix_db import SyncPool, TenantHandle
from fix_delivery import (
    DELIVERY_ENV,
    Erp,
    Jobs,
    Receiver,
    RegisterFn,
    settled,
    wait_for,
)
from fix_processes import ServiceProcess, SpawnFn, free_port, start_edge
from services.delivery import signing

WINDOW_SECONDS = 1
ACK_ENV = {**DELIVERY_ENV, "FATURA_ERP_ACK_WINDOW_SECONDS": str(WINDOW_SECONDS)}


@pytest.fixture(scope="module")
def dedge(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    """The delivery tests' edge, with an acknowledgement window of one second."""
    edge = start_edge(spawn, workers=1, FATURA_AUTH_CACHE_SECONDS="0", **ACK_ENV)
    yield edge
    edge.stop()


@pytest.fixture(scope="module")
def scheduler(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    port = free_port()
    process = spawn("delivery-scheduler", FATURA_DELIVERY_SCHEDULER_METRICS_PORT=str(port), **ACK_ENV)
    process.base_url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{process.base_url}/readyz")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def erp(
    spawn: SpawnFn, tmp_path_factory: pytest.TempPathFactory, erp_secret: str, dedge: ServiceProcess
) -> Iterator[Erp]:
    """The reference ERP, acknowledging to the edge after each ledger commit."""
    port = free_port()
    process = spawn(
        "erp",
        FATURA_ERP_PORT=str(port),
        FATURA_ERP_DB=str(tmp_path_factory.mktemp("erp") / "erp.sqlite"),
        FATURA_ERP_SECRETS=erp_secret,
        FATURA_ERP_ACK_URL=str(dedge.base_url),
    )
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/readyz")
    yield Erp(process, url)
    process.stop()


def _delivered(client: httpx.Client, tenant: TenantHandle, job_id: uuid.UUID) -> str:
    delivery = settled(client, tenant, job_id)
    assert delivery["state"] == "delivered", delivery
    return str(delivery["delivery_id"])


def _status(client: httpx.Client, tenant: TenantHandle, job_id: uuid.UUID) -> dict[str, Any]:
    response = client.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _ack_events(pool: SyncPool, job_id: uuid.UUID) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            """SELECT state, state_version, detail FROM job_events
               WHERE job_id = %s AND kind = 'erp_ack' ORDER BY seq""",
            (job_id,),
        ).fetchall()


def _reviews(pool: SyncPool, job_id: uuid.UUID) -> list[dict[str, Any]]:
    with pool.connection() as conn:
        return conn.execute(
            """SELECT r.id, r.kind, r.state, r.reasons, r.job_version, r.delivery_id::text AS delivery_id,
                      (SELECT array_agg(e.actor || ':' || e.action) FROM review_task_events e
                       WHERE e.task_id = r.id) AS trail
               FROM review_tasks r WHERE r.job_id = %s""",
            (job_id,),
        ).fetchall()


def _signed(secret: str, body: dict[str, Any] | bytes, **overrides: Any) -> tuple[dict[str, str], bytes]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = sign_headers(secret, overrides.pop("ack_id", f"ack_{uuid.uuid4().hex}"), raw, **overrides)
    return headers, raw


def test_a_signed_posted_ack_shows_on_the_jobs_status_and_in_its_events(
    worker: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    dedge: ServiceProcess,
    pool: SyncPool,
) -> None:
    # Given a result the ERP answered 2xx: received, not yet acknowledged
    endpoint = register(receiver.url)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery_id = _delivered(dclient, endpoint.tenant, job_id)
    assert "erp" not in _status(dclient, endpoint.tenant, job_id)
    # When the ERP acknowledges it, signed with the endpoint's secret
    answer = acknowledge(str(dedge.base_url), delivery_id, "posted", None, endpoint.secret)
    # Then the delivery, the job's status and its events say posted
    assert answer.status == 200, answer.body
    assert answer.body["ack"]["outcome"] == "posted" and answer.body["ack"]["reason"] is None
    erp = _status(dclient, endpoint.tenant, job_id)["erp"]
    assert (erp["delivery_id"], erp["outcome"], erp["reason"]) == (delivery_id, "posted", None)
    assert erp["received_at"] is not None and erp["at"] == answer.body["ack"]["acked_at"]
    events = _ack_events(pool, job_id)
    assert [(e["state"], e["detail"]["outcome"], e["detail"]["delivery_id"]) for e in events] == [
        ("SUCCEEDED", "posted", delivery_id)
    ]
    assert events[0]["detail"]["endpoint_id"] == endpoint.endpoint_id
    listed = dclient.get("/v1/deliveries", params={"job_id": str(job_id)}, headers=endpoint.tenant.headers)
    assert listed.json()["deliveries"][0]["ack"] == answer.body["ack"]
    # And the same acknowledgement again changes nothing; another outcome is a conflict
    again = acknowledge(str(dedge.base_url), delivery_id, "posted", None, endpoint.secret)
    assert again.status == 200 and again.body["ack"] == answer.body["ack"]
    changed = acknowledge(str(dedge.base_url), delivery_id, "rejected", "on second thought", endpoint.secret)
    assert (changed.status, changed.code) == (409, "ack_conflict")
    assert len(_ack_events(pool, job_id)) == 1 and _reviews(pool, job_id) == []
    assert _status(dclient, endpoint.tenant, job_id)["erp"] == erp


def test_an_ack_that_does_not_verify_is_401_and_changes_nothing(
    worker: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    dedge: ServiceProcess,
    pool: SyncPool,
) -> None:
    # Given a delivered result, and another endpoint of the same tenant with a secret of its own
    endpoint = register(receiver.url)
    other = register(receiver.url, secret=signing.new_secret(), tenant=endpoint.tenant)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery_id = next(
        d["delivery_id"]
        for d in wait_for(
            lambda: [
                d
                for d in dclient.get(
                    "/v1/deliveries", params={"job_id": str(job_id)}, headers=endpoint.tenant.headers
                ).json()["deliveries"]
                if d["endpoint_id"] == endpoint.endpoint_id and d["state"] == "delivered"
            ],
            20,
            "the delivery to the first endpoint",
        )
    )
    url = f"/v1/deliveries/{delivery_id}:ack"
    posted = {"outcome": "posted", "delivery_id": delivery_id}
    # When it is acknowledged with the other endpoint's secret, a stale signature, or none
    forged = acknowledge(str(dedge.base_url), delivery_id, "rejected", "forged", other.secret)
    stale_headers, stale_body = _signed(endpoint.secret, posted, timestamp=int(time.time()) - 3600)
    stale = dclient.post(url, content=stale_body, headers=stale_headers)
    unsigned = dclient.post(url, json=posted, headers=endpoint.tenant.headers)
    # Then each is a typed 401, and nothing changed
    assert (forged.status, forged.code) == (401, "bad_signature")
    assert (stale.status_code, stale.json()["error"]["code"]) == (401, "stale_timestamp")
    assert (unsigned.status_code, unsigned.json()["error"]["code"]) == (401, "missing_header")
    assert "erp" not in _status(dclient, endpoint.tenant, job_id)
    assert _ack_events(pool, job_id) == [] and _reviews(pool, job_id) == []
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT ack_outcome FROM deliveries WHERE delivery_id = %s", (delivery_id,)
        ).fetchone()
    assert row == {"ack_outcome": None}


def test_a_bad_ack_is_a_typed_error_and_changes_nothing(
    worker: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    endpoint = register(receiver.url)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery_id = _delivered(dclient, endpoint.tenant, job_id)
    url = f"/v1/deliveries/{delivery_id}:ack"
    cases: list[tuple[dict[str, Any] | bytes, int, str]] = [
        ({"outcome": "booked"}, 422, "invalid_request"),
        ({"outcome": "rejected"}, 422, "invalid_request"),
        ({"outcome": "rejected", "reason": "x" * 1001}, 422, "invalid_request"),
        ({"outcome": "posted", "reason": "fine"}, 422, "invalid_request"),
        ({"outcome": "posted", "colour": "blue"}, 422, "invalid_request"),
        ({"outcome": "posted", "delivery_id": str(uuid.uuid4())}, 422, "delivery_mismatch"),
        (b'{"outcome": "posted"', 400, "malformed_json"),
        (b"[" * 5000, 400, "malformed_json"),
    ]
    for body, status, code in cases:
        headers, raw = _signed(endpoint.secret, body)
        response = dclient.post(url, content=raw, headers=headers)
        assert (response.status_code, response.json()["error"]["code"]) == (status, code), body
    # A delivery that does not exist, and one that is only a verification ping
    headers, raw = _signed(endpoint.secret, {"outcome": "posted"})
    assert dclient.post(f"/v1/deliveries/{uuid.uuid4()}:ack", content=raw, headers=headers).status_code == 404
    ping = endpoint.body["verification"]["delivery_id"]
    refused = dclient.post(f"/v1/deliveries/{ping}:ack", content=raw, headers=headers)
    assert (refused.status_code, refused.json()["error"]["code"]) == (409, "not_acknowledgeable")
    assert "erp" not in _status(dclient, endpoint.tenant, job_id) and _ack_events(pool, job_id) == []


def test_a_delivery_not_yet_delivered_cannot_be_acknowledged(
    worker: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    dedge: ServiceProcess,
) -> None:
    # Given an endpoint that is disabled: its deliveries wait as failed, never received
    endpoint = register(receiver.url)
    dclient.post(f"/v1/webhook-endpoints/{endpoint.endpoint_id}:disable", headers=endpoint.tenant.headers)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery = settled(dclient, endpoint.tenant, job_id)
    assert delivery["state"] == "failed"
    answer = acknowledge(str(dedge.base_url), delivery["delivery_id"], "posted", None, endpoint.secret)
    assert (answer.status, answer.code, answer.retryable) == (409, "delivery_not_delivered", True)


def test_a_rejected_ack_opens_a_review_task_and_shows_on_the_status(
    worker: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    dedge: ServiceProcess,
    pool: SyncPool,
) -> None:
    endpoint = register(receiver.url)
    job_id = jobs.submit(endpoint.tenant)
    jobs.complete(endpoint.tenant, job_id)
    delivery_id = _delivered(dclient, endpoint.tenant, job_id)
    # When the ERP rejects it, with a reason
    url, headers, body = ack_request(
        str(dedge.base_url), delivery_id, "rejected", "cost centre 4711 is closed", endpoint.secret
    )
    answer = httpx.post(url, content=body, headers=headers)
    # Then the status says so and names the review task it opened, with the ERP's reason
    assert answer.status_code == 200, answer.text
    status = _status(dclient, endpoint.tenant, job_id)
    assert status["state"] == "SUCCEEDED"
    assert (status["erp"]["outcome"], status["erp"]["reason"]) == ("rejected", "cost centre 4711 is closed")
    (task,) = _reviews(pool, job_id)
    assert str(task["id"]) == status["erp"]["review_id"]
    assert (task["kind"], task["state"], task["delivery_id"]) == ("erp_rejected", "open", delivery_id)
    assert task["job_version"] == status["state_version"] and task["trail"] == ["erp:opened"]
    assert task["reasons"] == [
        {
            "code": "erp_rejected",
            "field": None,
            "message": "cost centre 4711 is closed",
            "detail": {"delivery_id": delivery_id},
        }
    ]
    # And a repeat opens nothing more
    assert httpx.post(url, content=body, headers=headers).status_code == 200
    assert len(_reviews(pool, job_id)) == 1 and len(_ack_events(pool, job_id)) == 1


def test_unacknowledged_lists_what_was_received_past_the_window_and_not_what_was_acknowledged(
    worker: ServiceProcess,
    scheduler: ServiceProcess,
    register: RegisterFn,
    receiver: Receiver,
    jobs: Jobs,
    dclient: httpx.Client,
    dedge: ServiceProcess,
) -> None:
    # Given three delivered results of one tenant, one of them acknowledged
    endpoint = register(receiver.url)
    tenant = endpoint.tenant
    job_ids = [jobs.submit(tenant) for _ in range(3)]
    for job_id in job_ids:
        jobs.complete(tenant, job_id)
    delivered = [_delivered(dclient, tenant, job_id) for job_id in job_ids]
    assert acknowledge(str(dedge.base_url), delivered[0], "posted", None, endpoint.secret).ok
    # When the window has passed
    time.sleep(WINDOW_SECONDS + 0.2)
    listed = dclient.get("/v1/deliveries", params={"unacknowledged": "1"}, headers=tenant.headers)
    # Then the two unacknowledged ones are listed, oldest first, and the acknowledged one is not
    assert listed.status_code == 200, listed.text
    body = listed.json()
    assert sorted(d["delivery_id"] for d in body["deliveries"]) == sorted(delivered[1:])
    assert all(d["ack"] is None and d["state"] == "delivered" for d in body["deliveries"])
    assert body["next_cursor"] is None and body["window_seconds"] == WINDOW_SECONDS
    # And they page one at a time
    first = dclient.get("/v1/deliveries?unacknowledged=1&limit=1", headers=tenant.headers).json()
    second = dclient.get(
        f"/v1/deliveries?unacknowledged=1&limit=1&cursor={first['next_cursor']}", headers=tenant.headers
    ).json()
    assert [d["delivery_id"] for d in first["deliveries"] + second["deliveries"]] == [
        d["delivery_id"] for d in body["deliveries"]
    ]
    assert second["next_cursor"] is None
    # And the delivery scheduler counts them
    wait_for(lambda: _gauge(scheduler, "fatura_deliveries_unacknowledged") >= 2, 10, "the gauge")


@pytest.mark.parametrize(
    "query",
    [
        "",
        "unacknowledged=0",
        "unacknowledged=1&job_id=01a22b15-3596-715b-805f-e7647f49c5a8",
        "unacknowledged=1&cursor=nope",
        "unacknowledged=1&cursor=5f0c2a4e-8d1b-4c3e-9a7f-2b6d1e0c9a84",  # a UUID, but no cursor
        "unacknowledged=1&limit=0",
        "unacknowledged=1&limit=1001",
        "job_id=01a22b15-3596-715b-805f-e7647f49c5a8&limit=5",
    ],
)
def test_the_deliveries_listing_needs_a_job_or_unacknowledged(
    dclient: httpx.Client, tenant: TenantHandle, query: str
) -> None:
    response = dclient.get(f"/v1/deliveries?{query}", headers=tenant.headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in ("invalid_query", "invalid_cursor")


def _gauge(process: ServiceProcess, name: str) -> float:
    text = httpx.get(f"{process.base_url}/metrics", timeout=5).text
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else -1.0


def _invoice(number: str, tax_id: str) -> dict[str, Any]:
    return {
        "invoice_number": number,
        "supplier": {"name": "Kırtasiye A.Ş.", "tax_id": tax_id},
        "total": "10.00",
    }


def test_the_reference_erp_acknowledges_after_its_commit_and_rejects_a_duplicate_invoice_number(
    worker: ServiceProcess,
    erp: Erp,
    register: RegisterFn,
    jobs: Jobs,
    dclient: httpx.Client,
    pool: SyncPool,
) -> None:
    # Given a tenant whose ERP is the reference ERP, acknowledging to the edge
    endpoint = register(erp.webhook_url)
    tenant = endpoint.tenant
    # When two jobs bring the same supplier's invoice number (spelled two ways), and a third another
    first, duplicate, other = (jobs.submit(tenant) for _ in range(3))
    jobs.complete(tenant, first, result=_invoice("FTR-2026-0042", "TR 1234567890"))
    posted = wait_for(lambda: _status(dclient, tenant, first).get("erp"), 20, "the first acknowledgement")
    jobs.complete(tenant, duplicate, result=_invoice("FTR-2026-0042", "tr1234567890"))
    jobs.complete(tenant, other, result=_invoice("FTR-2026-0043", "TR1234567890"))
    # Then the first and the third are posted, the duplicate rejected with the ERP's reason
    rejected = wait_for(lambda: _status(dclient, tenant, duplicate).get("erp"), 20, "the duplicate's")
    third = wait_for(lambda: _status(dclient, tenant, other).get("erp"), 20, "the third's")
    assert (posted["outcome"], third["outcome"]) == ("posted", "posted")
    assert rejected["outcome"] == "rejected"
    assert rejected["reason"] == "duplicate invoice number FTR-2026-0042 for supplier TR1234567890"
    (task,) = _reviews(pool, duplicate)
    assert task["kind"] == "erp_rejected" and str(task["id"]) == rejected["review_id"]
    assert _reviews(pool, first) == []
    # And the ERP's ledger shows each entry's acknowledgement as sent, after the entry was applied
    entry = erp.ledger(duplicate)
    assert entry is not None and entry["ack"]["state"] == "sent"
    assert (entry["ack"]["outcome"], entry["ack"]["delivery_id"]) == ("rejected", rejected["delivery_id"])
    first_entry = erp.ledger(first)
    assert first_entry is not None and first_entry["ack"]["outcome"] == "posted"
    assert [e["detail"]["outcome"] for e in _ack_events(pool, duplicate)] == ["rejected"]
