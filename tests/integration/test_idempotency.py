"""Idempotency (DESIGN §5.1), raced for real against the two-worker edge."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from fix_api import INVOICE, SubmitFn, job_body
from fix_db import SyncPool, TenantHandle, count_rows
from fix_processes import ServiceProcess


def _race(
    edge: ServiceProcess, tenant: TenantHandle, key: str, bodies: list[dict[str, Any]]
) -> list[httpx.Response]:
    """Send every body at the same instant, one thread and one connection each."""
    barrier = threading.Barrier(len(bodies))
    assert edge.base_url is not None

    def send(body: dict[str, Any]) -> httpx.Response:
        with httpx.Client(base_url=edge.base_url, timeout=30.0) as c:
            barrier.wait()
            return c.post(
                "/v1/extraction-jobs", json=body, headers={**tenant.headers, "Idempotency-Key": key}
            )

    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        return list(pool.map(send, bodies))


def test_fifty_simultaneous_identical_requests_make_one_job_and_one_outbox_event(
    edge: ServiceProcess, tenant: TenantHandle, pool: SyncPool
) -> None:
    """Given 50 clients retrying the same submission at once, then exactly one job exists."""
    replies = _race(edge, tenant, "burst-1", [job_body()] * 50)

    assert [r.status_code for r in replies] == [202] * 50
    job_ids = {r.json()["job_id"] for r in replies}
    assert len(job_ids) == 1
    assert sum(r.headers.get("idempotent-replayed") == "true" for r in replies) == 49
    assert count_rows(pool, tenant.id) == {"jobs": 1, "documents": 1, "outbox": 1, "job_events": 1}


def test_racing_different_bodies_under_one_key_yields_one_job_and_409s_for_the_losers(
    edge: ServiceProcess, tenant: TenantHandle, pool: SyncPool
) -> None:
    body_a, body_b = job_body(INVOICE + "A"), job_body(INVOICE + "B")
    replies = _race(edge, tenant, "contested", [body_a, body_b] * 15)

    codes = Counter(r.status_code for r in replies)
    assert set(codes) <= {202, 409}
    winner = {r.json()["job_id"] for r in replies if r.status_code == 202}
    assert len(winner) == 1
    assert codes[202] == 15 and codes[409] == 15  # all copies of the winning body agree, the rest conflict
    named = {r.json()["error"]["job_id"] for r in replies if r.status_code == 409}
    assert named == winner
    assert count_rows(pool, tenant.id) == {"jobs": 1, "documents": 1, "outbox": 1, "job_events": 1}


def test_the_same_key_with_a_different_body_is_409_naming_the_existing_job_and_writes_nothing(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    first = submit(tenant, job_body(), key="invoice-7")
    before = count_rows(pool, tenant.id)

    other_text = submit(tenant, job_body(INVOICE + "changed"), key="invoice-7")
    other_options = submit(tenant, job_body(options={"language": "tr"}), key="invoice-7")

    for reply in (other_text, other_options):
        assert reply.status_code == 409
        error = reply.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert error["job_id"] == first.json()["job_id"]
        assert first.json()["job_id"] in error["message"]
    assert count_rows(pool, tenant.id) == before


def test_a_retry_that_changes_only_scheduling_returns_the_original_job(
    submit: SubmitFn, tenant: TenantHandle
) -> None:
    """Priority and deadline do not change the extraction, so they are not part of the request hash."""
    first = submit(tenant, job_body(priority="batch"), key="invoice-8")
    again = submit(tenant, job_body(priority="interactive", deadline_seconds=3600), key="invoice-8")
    assert again.status_code == 202
    assert again.json()["job_id"] == first.json()["job_id"]


def test_a_replay_of_a_finished_job_says_it_is_done(
    submit: SubmitFn, tenant: TenantHandle, pool: SyncPool
) -> None:
    first = submit(tenant, key="invoice-9").json()
    with pool.connection() as conn:
        conn.execute(
            "UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %s", (uuid.UUID(first["job_id"]),)
        )
        conn.execute(
            "UPDATE extraction_jobs SET state = 'SUCCEEDED', state_version = 2 WHERE id = %s",
            (uuid.UUID(first["job_id"]),),
        )
    again = submit(tenant, key="invoice-9")
    assert again.status_code == 202
    assert again.json()["done"] is True and again.json()["state"] == "SUCCEEDED"
    assert "already finished" in again.json()["message"]


def test_by_reference_the_key_binds_the_document_version(
    client: httpx.Client, submit: SubmitFn, tenant: TenantHandle
) -> None:
    doc = client.post("/v1/documents", json={"text": INVOICE}, headers=tenant.headers).json()
    client.post(
        "/v1/documents",
        json={"text": INVOICE + "v2", "document_id": doc["document_id"]},
        headers=tenant.headers,
    )
    ref = {"document_id": doc["document_id"]}

    first = submit(tenant, {**ref, "document_version": 1}, key="by-ref")
    same = submit(tenant, {**ref, "document_version": 1}, key="by-ref")
    other = submit(tenant, {**ref, "document_version": 2}, key="by-ref")

    assert first.status_code == same.status_code == 202
    assert same.json()["job_id"] == first.json()["job_id"]
    assert other.status_code == 409
