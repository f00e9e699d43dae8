"""The review workflow (DESIGN §5.13) through the edge, on jobs the real pipeline sent to review:
a reviewer key reads, claims and decides; two reviewers racing for one task cannot both decide it;
a correction is validated again; every decision is in the job's events and on its status."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fix_db import TenantHandle
from fix_pipeline import TERMINAL, Pipeline, StartPipeline, sample_text
from services.acceptance.keys import create_key


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory()
    pipeline.start_processing()
    yield pipeline


@pytest.fixture(scope="module")
def tenant(pipe: Pipeline) -> TenantHandle:
    return pipe.make_tenant()


def _reviewer(pipe: Pipeline, tenant: TenantHandle, label: str) -> dict[str, str]:
    _, key = create_key(pipe.pool, scope="reviewer", tenant_id=tenant.id, label=label)
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def alice(pipe: Pipeline, tenant: TenantHandle) -> dict[str, str]:
    return _reviewer(pipe, tenant, "alice")


@pytest.fixture(scope="module")
def bob(pipe: Pipeline, tenant: TenantHandle) -> dict[str, str]:
    return _reviewer(pipe, tenant, "bob")


@pytest.fixture(scope="module")
def http(pipe: Pipeline) -> Iterator[httpx.Client]:
    with pipe.client() as client:
        yield client


def _in_review(pipe: Pipeline, tenant: TenantHandle, sample: str = "06_review_bad_arithmetic_try.txt") -> str:
    job_id = pipe.submit(tenant, sample_text(sample))
    assert pipe.wait_state(job_id, TERMINAL)["state"] == "REVIEW_REQUIRED"
    return job_id


def _review_of(http: httpx.Client, reviewer: dict[str, str], job_id: str) -> dict[str, Any]:
    listed = http.get("/v1/reviews", params={"state": "all", "limit": 200}, headers=reviewer).json()
    found = [r for r in listed["reviews"] if r["job_id"] == job_id]
    assert len(found) == 1, listed
    return found[0]


def _outbox_types(pipe: Pipeline, job_id: str) -> list[str]:
    with pipe.pool.connection() as conn:
        rows = conn.execute(
            "SELECT event_type FROM outbox_events WHERE job_id = %s ORDER BY created_at", (job_id,)
        ).fetchall()
    return [r["event_type"] for r in rows]


def _claim(http: httpx.Client, reviewer: dict[str, str], review_id: str) -> int:
    response = http.post(f"/v1/reviews/{review_id}:claim", headers=reviewer)
    assert response.status_code == 200, response.text
    fence: int = response.json()["fence"]
    return fence


def test_a_job_in_review_is_not_done_waits_for_a_reviewer_and_was_never_sent_to_the_erp(
    pipe: Pipeline, tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant)
    status = http.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers).json()
    assert status["state"] == "REVIEW_REQUIRED" and status["done"] is False
    review = _review_of(http, alice, job_id)
    assert status["review"]["review_id"] == review["review_id"]
    assert review["state"] == "open" and review["kind"] == "validation"
    assert [r["code"] for r in review["reasons"]] == ["arithmetic_total"]
    # The review request is an event of its own, never the ERP's extraction.* events
    assert _outbox_types(pipe, job_id) == ["extraction.requested.v1", "review.requested.v1"]


def test_a_review_shows_the_source_text_the_fields_and_each_evidence_span_with_its_text(
    pipe: Pipeline, tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant)
    review_id = _review_of(http, alice, job_id)["review_id"]
    body = http.get(f"/v1/reviews/{review_id}", headers=alice).json()
    assert body["result"]["invoice_number"] == "AK-2026-000191"
    assert "Genel Toplam" in body["document"]["text"] and body["document"]["pages"]
    evidence = {e["field"]: e for e in body["evidence"]}
    assert evidence["/total"]["text"] is not None and "1.316,80" in evidence["/total"]["text"]
    assert [h["action"] for h in body["history"]] == ["opened"]


def test_a_tenant_key_cannot_see_or_decide_reviews_and_another_tenants_reviewer_finds_nothing(
    pipe: Pipeline, tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant)
    review_id = _review_of(http, alice, job_id)["review_id"]
    for method, path in (("GET", "/v1/reviews"), ("POST", f"/v1/reviews/{review_id}:claim")):
        refused = http.request(method, path, headers=tenant.headers)
        assert refused.status_code == 403 and refused.json()["error"]["required_scope"] == "reviewer"
    stranger = _reviewer(pipe, pipe.make_tenant(), "stranger")
    assert http.get(f"/v1/reviews/{review_id}", headers=stranger).status_code == 404
    assert http.post(f"/v1/reviews/{review_id}:claim", headers=stranger).status_code == 404
    assert http.get("/v1/reviews", params={"state": "all"}, headers=stranger).json()["reviews"] == []


def test_two_reviewers_racing_for_one_task_cannot_both_decide_it(
    pipe: Pipeline,
    tenant: TenantHandle,
    alice: dict[str, str],
    bob: dict[str, str],
    http: httpx.Client,
) -> None:
    job_id = _in_review(pipe, tenant)
    review_id = _review_of(http, alice, job_id)["review_id"]
    # Both claim at the same moment, then both try to approve under what their claim returned
    start = threading.Barrier(2)
    answers: dict[str, httpx.Response] = {}

    def claim_and_approve(name: str, headers: dict[str, str]) -> None:
        with pipe.client() as client:
            start.wait()
            claimed = client.post(f"/v1/reviews/{review_id}:claim", headers=headers)
            fence = claimed.json().get("fence", 1) if claimed.status_code == 200 else 1
            answers[name] = client.post(
                f"/v1/reviews/{review_id}:approve", json={"fence": fence}, headers=headers
            )

    threads = [threading.Thread(target=claim_and_approve, args=a) for a in (("alice", alice), ("bob", bob))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers.values())
    assert codes == [200, 409], {k: v.text for k, v in answers.items()}
    loser = next(r for r in answers.values() if r.status_code == 409)
    assert loser.json()["error"]["code"] in ("review_claimed", "review_decided", "review_not_claimed")
    # One decision, one new state version, one completion event
    job = pipe.job(job_id)
    assert job["state"] == "SUCCEEDED" and job["decided_by"] == "reviewer"
    assert _outbox_types(pipe, job_id).count("extraction.completed.v1") == 1
    history = http.get(f"/v1/reviews/{review_id}", headers=alice).json()["history"]
    assert [h["action"] for h in history].count("approved") == 1


def test_a_decision_under_an_older_claim_is_refused_and_changes_nothing(
    pipe: Pipeline, tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant)
    review_id = _review_of(http, alice, job_id)["review_id"]
    old = _claim(http, alice, review_id)
    new = _claim(http, alice, review_id)
    assert new == old + 1
    stale = http.post(f"/v1/reviews/{review_id}:approve", json={"fence": old}, headers=alice)
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_claim"
    unclaimed = _in_review(pipe, tenant)
    other = _review_of(http, alice, unclaimed)["review_id"]
    refused = http.post(f"/v1/reviews/{other}:approve", json={"fence": 1}, headers=alice)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "review_not_claimed"
    assert pipe.job(job_id)["state"] == pipe.job(unclaimed)["state"] == "REVIEW_REQUIRED"


def test_a_correction_that_still_fails_validation_is_refused_and_a_valid_one_succeeds_beside_the_models(
    pipe: Pipeline, tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant)
    review_id = _review_of(http, alice, job_id)["review_id"]
    fence = _claim(http, alice, review_id)
    before = pipe.job(job_id)
    # A total that still does not add up: 422 with the reasons, nothing changed
    wrong = http.post(
        f"/v1/reviews/{review_id}:correct",
        json={"fence": fence, "changes": {"/total": "1300.00"}},
        headers=alice,
    )
    assert wrong.status_code == 422, wrong.text
    assert wrong.json()["error"]["code"] == "correction_invalid"
    assert [r["code"] for r in wrong.json()["error"]["reasons"]] == ["arithmetic_total"]
    unknown = http.post(
        f"/v1/reviews/{review_id}:correct", json={"fence": fence, "changes": {"/nope": "1"}}, headers=alice
    )
    assert unknown.status_code == 422 and unknown.json()["error"]["code"] == "unknown_field"
    assert pipe.job(job_id)["state_version"] == before["state_version"]
    # The right total: SUCCEEDED, decided by a reviewer, the model's result kept beside
    right = http.post(
        f"/v1/reviews/{review_id}:correct",
        json={"fence": fence, "changes": {"/total": "1216.80"}},
        headers=alice,
    )
    assert right.status_code == 200, right.text
    assert right.json()["state"] == "corrected"
    status = http.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers).json()
    assert status["state"] == "SUCCEEDED" and status["done"] is True
    assert status["decided_by"] == "reviewer"
    assert status["state_version"] == before["state_version"] + 1
    assert status["result"]["total"] == "1216.80"
    assert status["correction"]["changes"] == {"/total": "1216.80"}
    assert status["correction"]["model_result"]["total"] == before["result"]["total"]
    assert _outbox_types(pipe, job_id)[-1] == "extraction.completed.v1"
    with pipe.pool.connection() as conn:
        events = conn.execute(
            "SELECT state, kind, detail FROM job_events WHERE job_id = %s ORDER BY seq", (job_id,)
        ).fetchall()
    assert events[-1]["state"] == "SUCCEEDED" and events[-1]["detail"]["reviewer"] == "alice"
    # A decided review cannot be decided again
    again = http.post(f"/v1/reviews/{review_id}:reject", json={"fence": fence, "reason": "x"}, headers=alice)
    assert again.status_code == 409 and again.json()["error"]["code"] == "review_decided"


def test_a_rejection_makes_the_job_rejected_with_the_reason_and_tells_the_erp(
    pipe: Pipeline, tenant: TenantHandle, bob: dict[str, str], http: httpx.Client
) -> None:
    job_id = _in_review(pipe, tenant, "07_review_unknown_supplier_try.txt")
    review_id = _review_of(http, bob, job_id)["review_id"]
    fence = _claim(http, bob, review_id)
    rejected = http.post(
        f"/v1/reviews/{review_id}:reject", json={"fence": fence, "reason": "not our supplier"}, headers=bob
    )
    assert rejected.status_code == 200, rejected.text
    status = http.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers).json()
    assert status["state"] == "REJECTED" and status["done"] is True
    assert status["error"] == {"class": "review_rejected", "message": "not our supplier"}
    assert "result" not in status
    assert _outbox_types(pipe, job_id)[-1] == "extraction.rejected.v1"
    decided = http.get("/v1/reviews", params={"state": "decided"}, headers=bob).json()["reviews"]
    assert review_id in [r["review_id"] for r in decided]


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"fence": 0},
        {"fence": "1"},
        {"fence": 1, "extra": True},
        {"fence": 1, "changes": {}},
        {"fence": 1, "changes": {"total": "1"}},
    ],
)
def test_a_malformed_decision_is_a_typed_422(
    body: dict[str, Any], tenant: TenantHandle, alice: dict[str, str], http: httpx.Client
) -> None:
    response = http.post(f"/v1/reviews/{uuid.uuid4()}:correct", json=body, headers=alice)
    assert response.status_code == 422, response.text
