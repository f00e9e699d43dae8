"""The job API as a customer's app sees it: 202 bodies, status, listing, cancelling, documents, isolation."""

from __future__ import annotations

import uuid

import httpx

from fix_api import INVOICE, SubmitFn, job_body
from fix_db import MakeTenant, SyncPool, TenantHandle, count_rows


def test_accepting_a_job_answers_202_with_location_and_a_body_that_says_it_is_not_complete(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    """Given a tenant, when it submits an invoice, then it gets 202 at once and words it cannot misread."""
    reply = submit(tenant, job_body(priority="interactive"))

    assert reply.status_code == 202
    body = reply.json()
    assert reply.headers["location"] == body["status_url"] == f"/v1/extraction-jobs/{body['job_id']}"
    assert body["state"] == "READY"
    assert body["done"] is False
    assert body["poll_after_seconds"] >= 1
    assert body["estimated_duration_seconds"] >= 0
    assert "STARTED" in body["message"] and "NOT complete" in body["message"]
    assert f"after at least {body['poll_after_seconds']} seconds" in body["message"]
    # One transaction wrote the job, its document, its job event and its outbox event.
    assert count_rows(pool, tenant.id) == {"jobs": 1, "documents": 1, "outbox": 1, "job_events": 1}
    with pool.connection() as conn:
        event = conn.execute(
            "SELECT event_type, payload FROM outbox_events WHERE job_id = %s", (uuid.UUID(body["job_id"]),)
        ).fetchone()
    assert event is not None
    assert event["event_type"] == "extraction.requested.v1"
    # Messages carry ids and versions, never the invoice text.
    assert event["payload"]["job_id"] == body["job_id"]
    assert event["payload"]["state_version"] == 1
    assert "text" not in event["payload"] and INVOICE[:20] not in str(event["payload"])


def test_status_of_a_queued_job_says_not_done_and_when_to_poll(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle
) -> None:
    job_id = submit(tenant).json()["job_id"]

    status = client.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers)

    assert status.status_code == 200
    body = status.json()
    assert body["job_id"] == job_id
    assert body["state"] == "READY"
    assert body["done"] is False
    assert body["state_version"] == 1
    assert body["attempts"] == 0
    assert body["poll_after_seconds"] >= 1
    assert "NOT complete" in body["message"]
    assert body["elapsed_seconds"] >= 0


def test_a_job_can_reference_a_stored_document_version(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle
) -> None:
    """Given a stored document with two versions, a job names the exact version it extracts."""
    first = client.post("/v1/documents", json={"text": INVOICE, "filename": "a.txt"}, headers=tenant.headers)
    assert first.status_code == 201
    doc = first.json()
    assert doc["version"] == 1 and doc["size"] == len(INVOICE.encode()) and len(doc["sha256"]) == 64
    second = client.post(
        "/v1/documents",
        json={"text": INVOICE + "\nDüzeltme", "document_id": doc["document_id"]},
        headers=tenant.headers,
    )
    assert second.status_code == 201
    assert second.json()["document_id"] == doc["document_id"]
    assert second.json()["version"] == 2
    assert second.json()["filename"] == "a.txt"

    reply = submit(tenant, {"document_id": doc["document_id"], "document_version": 2})
    assert reply.status_code == 202
    status = client.get(reply.json()["status_url"], headers=tenant.headers).json()
    assert status["document"] == {"document_id": doc["document_id"], "version": 2}


def test_a_job_naming_a_document_that_does_not_exist_is_refused_and_writes_nothing(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    reply = submit(tenant, {"document_id": str(uuid.uuid4()), "document_version": 1})

    assert reply.status_code == 422
    assert reply.json()["error"]["code"] == "document_not_found"
    assert count_rows(pool, tenant.id)["jobs"] == 0


def test_a_new_version_of_an_unknown_document_is_404(client: httpx.Client, tenant: TenantHandle) -> None:
    reply = client.post(
        "/v1/documents", json={"text": "x", "document_id": str(uuid.uuid4())}, headers=tenant.headers
    )
    assert reply.status_code == 404
    assert reply.json()["error"]["code"] == "document_not_found"


def test_listing_pages_through_every_job_exactly_once_newest_first(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle
) -> None:
    created = [submit(tenant).json()["job_id"] for _ in range(5)]

    seen: list[str] = []
    cursor: str | None = None
    pages = 0
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/extraction-jobs", params=params, headers=tenant.headers)
        assert page.status_code == 200
        body = page.json()
        assert len(body["jobs"]) <= 2
        seen.extend(j["job_id"] for j in body["jobs"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break

    assert seen == list(reversed(created))
    assert pages == 3


def test_listing_filters_by_state(client: httpx.Client, submit: SubmitFn, tenant: TenantHandle) -> None:
    kept = submit(tenant).json()["job_id"]
    cancelled = submit(tenant).json()["job_id"]
    assert client.post(f"/v1/extraction-jobs/{cancelled}:cancel", headers=tenant.headers).status_code == 200

    ready = client.get("/v1/extraction-jobs", params={"state": "READY"}, headers=tenant.headers).json()
    gone = client.get("/v1/extraction-jobs", params={"state": "CANCELLED"}, headers=tenant.headers).json()

    assert [j["job_id"] for j in ready["jobs"]] == [kept]
    assert [j["job_id"] for j in gone["jobs"]] == [cancelled]
    assert gone["jobs"][0]["done"] is True


def test_a_cursor_the_server_did_not_issue_is_400(client: httpx.Client, tenant: TenantHandle) -> None:
    reply = client.get("/v1/extraction-jobs", params={"cursor": "not-a-cursor"}, headers=tenant.headers)
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "invalid_cursor"


def test_cancelling_a_queued_job_ends_it_frees_its_quota_and_records_an_event(
    client: httpx.Client, submit: SubmitFn, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    """Given a tenant whose pending-jobs cap is 1, cancelling its job lets the next one in."""
    tenant = make_tenant(max_pending_jobs=1)
    job_id = submit(tenant).json()["job_id"]
    assert submit(tenant).status_code == 429

    reply = client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers)

    assert reply.status_code == 200
    body = reply.json()
    assert body["state"] == "CANCELLED" and body["done"] is True and body["state_version"] == 2
    assert "poll_after_seconds" not in body
    with pool.connection() as conn:
        events = conn.execute(
            "SELECT event_type, payload->>'state_version' AS v FROM outbox_events"
            " WHERE job_id = %s ORDER BY created_at",
            (uuid.UUID(job_id),),
        ).fetchall()
        log = conn.execute(
            "SELECT state, state_version FROM job_events WHERE job_id = %s ORDER BY seq", (uuid.UUID(job_id),)
        ).fetchall()
    assert [(e["event_type"], e["v"]) for e in events] == [
        ("extraction.requested.v1", "1"),
        ("extraction.cancelled.v1", "2"),
    ]
    assert [(e["state"], e["state_version"]) for e in log] == [("READY", 1), ("CANCELLED", 2)]
    assert submit(tenant).status_code == 202


def test_cancelling_twice_is_a_no_op(client: httpx.Client, submit: SubmitFn, tenant: TenantHandle) -> None:
    job_id = submit(tenant).json()["job_id"]
    first = client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers)
    second = client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers)
    assert first.status_code == second.status_code == 200
    assert second.json()["state_version"] == first.json()["state_version"] == 2


def test_a_finished_job_cannot_be_cancelled(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    """Given a job that already succeeded, a cancel is refused with 409 and the job is untouched."""
    job_id = submit(tenant).json()["job_id"]
    with pool.connection() as conn:  # stands in for the inference worker claiming and finishing the job
        conn.execute("UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %s", (uuid.UUID(job_id),))
        conn.execute(
            "UPDATE extraction_jobs SET state = 'SUCCEEDED', state_version = 2, finished_at = now()"
            " WHERE id = %s",
            (uuid.UUID(job_id),),
        )

    reply = client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers)

    assert reply.status_code == 409
    assert reply.json()["error"]["code"] == "job_already_finished"
    status = client.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers).json()
    assert status["state"] == "SUCCEEDED" and status["done"] is True and status["state_version"] == 2


def test_a_tenant_cannot_see_list_or_cancel_another_tenants_job(
    client: httpx.Client, submit: SubmitFn, make_tenant: MakeTenant
) -> None:
    alice, bob = make_tenant(), make_tenant()
    job_id = submit(alice).json()["job_id"]

    assert client.get(f"/v1/extraction-jobs/{job_id}", headers=bob.headers).status_code == 404
    assert client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=bob.headers).status_code == 404
    assert client.get("/v1/extraction-jobs", headers=bob.headers).json()["jobs"] == []
    assert client.get(f"/v1/extraction-jobs/{job_id}", headers=alice.headers).json()["state"] == "READY"


def test_the_same_idempotency_key_in_two_tenants_makes_two_jobs(
    submit: SubmitFn, make_tenant: MakeTenant
) -> None:
    alice, bob = make_tenant(), make_tenant()
    a = submit(alice, key="order-42")
    b = submit(bob, key="order-42")
    assert a.status_code == b.status_code == 202
    assert a.json()["job_id"] != b.json()["job_id"]


def test_a_document_of_another_tenant_cannot_be_referenced(
    client: httpx.Client, submit: SubmitFn, make_tenant: MakeTenant
) -> None:
    alice, bob = make_tenant(), make_tenant()
    doc = client.post("/v1/documents", json={"text": INVOICE}, headers=alice.headers).json()

    reply = submit(bob, {"document_id": doc["document_id"], "document_version": 1})

    assert reply.status_code == 422
    assert reply.json()["error"]["code"] == "document_not_found"


def test_requests_without_a_valid_key_are_401(client: httpx.Client, tenant: TenantHandle) -> None:
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic abc"}):
        reply = client.get("/v1/extraction-jobs", headers=headers)
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"].startswith("Bearer")
        assert reply.json()["error"]["code"] == "unauthorized"
    forged = tenant.api_key[:-4] + ("AAAA" if not tenant.api_key.endswith("AAAA") else "BBBB")
    assert client.get("/v1/extraction-jobs", headers={"Authorization": f"Bearer {forged}"}).status_code == 401


def test_unknown_job_ids_and_malformed_ids_are_404(client: httpx.Client, tenant: TenantHandle) -> None:
    for job_id in (str(uuid.uuid4()), "not-a-uuid"):
        reply = client.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers)
        assert reply.status_code == 404
        assert reply.json()["error"]["code"] == "job_not_found"


def test_health_and_readiness_answer(client: httpx.Client) -> None:
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
