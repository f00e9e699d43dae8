"""The SDK's clients against a scripted API (httpx.MockTransport): the requests they send, the
typed errors they raise, what they retry and with which Idempotency-Key."""

from __future__ import annotations

import asyncio
import inspect
import random
from pathlib import Path

import httpx
import pytest
from sdk_fakes import JOB, KEY, FakeTime, Script, accepted, make_client, respond, status

import fatura_sdk
from fatura_sdk import (
    AsyncClient,
    Client,
    Conflict,
    NotFound,
    RateLimited,
    RetryPolicy,
    ServiceUnavailable,
    StoredDocument,
    TransportError,
    ValidationError,
)
from fatura_sdk._http import _NOT_SENT, translate
from fatura_sdk.errors import error_from_answer, retry_after_seconds

BATCH = "0190a1b2-c3d4-7e5f-8a9b-000000000001"


@pytest.fixture
def script() -> Script:
    return Script(FakeTime())


def test_submit_sends_the_document_inline_with_a_generated_key_and_says_it_is_not_complete(
    script: Script,
) -> None:
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    with make_client(script) as client:
        job = client.submit("FATURA No: 1", filename="1.txt", priority="interactive", deadline_seconds=600)

    (request,) = script.seen
    assert request.body == {
        "document": {"text": "FATURA No: 1", "filename": "1.txt"},
        "priority": "interactive",
        "deadline_seconds": 600,
    }
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.headers["idempotency-key"] == job.idempotency_key
    assert job.idempotency_key.startswith("sdk-")
    assert (job.job_id, job.done, job.replayed) == (JOB, False, False)
    assert "NOT complete" in job.message


def test_submit_of_an_uploaded_document_and_of_a_file(script: Script, tmp_path: Path) -> None:
    script.on(
        "POST /v1/documents",
        respond(201, {"document_id": BATCH, "version": 2, "sha256": "0" * 64, "size": 3}),
    )
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    path = tmp_path / "inv.txt"
    path.write_text("Rechnung", encoding="utf-8")
    with make_client(script) as client:
        stored = client.upload("abc", filename="a.txt")
        client.submit(stored)
        client.submit(path)
    assert script.seen[0].body == {"text": "abc", "filename": "a.txt"}
    assert stored == StoredDocument(BATCH, 2, "0" * 64, 3, stored.raw)
    assert script.seen[1].body == {"document_id": BATCH, "document_version": 2}
    assert script.seen[2].body == {"document": {"text": "Rechnung", "filename": "inv.txt"}}


def test_a_submission_retried_after_429_503_and_a_lost_answer_keeps_its_key_and_honours_retry_after(
    script: Script,
) -> None:
    """Given the edge answers 429 (Retry-After 3), 503 (Retry-After 2), then the connection breaks
    after sending, then 202
    When one submit is made
    Then it is sent four times with one Idempotency-Key, after waiting at least what was asked."""
    script.on(
        "POST /v1/extraction-jobs",
        respond(429, {"error": {"code": "tenant_quota_exceeded", "message": "m"}}, retry_after="3"),
        respond(503, {"error": {"code": "system_backlog_full", "message": "m"}}, retry_after="2"),
        httpx.ReadTimeout("lost"),
        respond(202, accepted(), Idempotent_Replayed="true"),
    )
    with make_client(script) as client:
        job = client.submit("text")
    keys = {s.headers["idempotency-key"] for s in script.seen}
    assert len(script.seen) == 4 and keys == {job.idempotency_key}
    assert 3 <= script.time.sleeps[0] <= 3.5 and 2 <= script.time.sleeps[1] <= 2.5
    assert job.replayed


def test_a_retry_after_beyond_the_policy_is_raised_at_once_with_its_delay(script: Script) -> None:
    script.on(
        "POST /v1/extraction-jobs",
        respond(429, {"error": {"code": "tenant_quota_exceeded", "message": "budget"}}, retry_after="36000"),
    )
    with make_client(script) as client, pytest.raises(RateLimited) as raised:
        client.submit("text")
    assert raised.value.retry_after == 36000 and raised.value.code == "tenant_quota_exceeded"
    assert len(script.seen) == 1


def test_retries_end_after_max_attempts_with_the_typed_error(script: Script) -> None:
    script.on("GET /v1/extraction-jobs", respond(503, {"error": {"code": "unavailable", "message": "m"}}))
    with make_client(script, retry=RetryPolicy(max_attempts=3)) as client, pytest.raises(ServiceUnavailable):
        client.list()
    assert len(script.seen) == 3


def test_an_upload_whose_answer_was_lost_is_not_sent_again(script: Script) -> None:
    script.on("POST /v1/documents", httpx.ReadTimeout("lost"))
    with make_client(script) as client, pytest.raises(TransportError) as raised:
        client.upload("abc")
    assert raised.value.sent and len(script.seen) == 1


def test_client_mistakes_raise_their_typed_error_with_the_apis_code(script: Script) -> None:
    script.on(
        "POST /v1/extraction-jobs",
        respond(422, {"error": {"code": "invalid_request", "message": "bad", "errors": [{"path": "$.x"}]}}),
        respond(
            409,
            {"error": {"code": "idempotency_key_reused", "message": "m", "job_id": JOB, "status_url": "/x"}},
        ),
    )
    script.on(
        f"GET /v1/extraction-jobs/{JOB}", respond(404, {"error": {"code": "job_not_found", "message": "m"}})
    )
    with make_client(script) as client:
        with pytest.raises(ValidationError) as invalid:
            client.submit("text")
        with pytest.raises(Conflict) as conflict:
            client.submit("text")
        with pytest.raises(NotFound):
            client.get(JOB)
    assert invalid.value.details["errors"] == [{"path": "$.x"}] and invalid.value.status == 422
    assert conflict.value.code == "idempotency_key_reused" and conflict.value.job_id == JOB
    assert len(script.seen) == 3  # none of them retried


def test_get_list_cancel_and_paging(script: Script) -> None:
    summary = {"job_id": JOB, "state": "READY", "done": False, "state_version": 1, "status_url": "/x"}
    script.on(
        "GET /v1/extraction-jobs",
        respond(200, {"jobs": [summary], "next_cursor": "c1"}),
        respond(200, {"jobs": [summary], "next_cursor": None}),
    )
    script.on(f"GET /v1/extraction-jobs/{JOB}", respond(200, status("RUNNING")))
    script.on(f"POST /v1/extraction-jobs/{JOB}:cancel", respond(200, status("CANCELLED", version=3)))
    with make_client(script) as client:
        assert client.get(JOB).state == "RUNNING"
        jobs = list(client.iter_jobs(state="READY", page_size=1))
        cancelled = client.cancel(JOB)
    assert len(jobs) == 2
    assert (cancelled.state, cancelled.done, cancelled.succeeded) == ("CANCELLED", True, False)
    lists = [s for s in script.seen if s.path == "/v1/extraction-jobs"]
    assert len(lists) == 2


def test_batches_submit_read_and_page_through_items(script: Script) -> None:
    names = (
        "total",
        "processed",
        "pending",
        "succeeded",
        "review_required",
        "failed",
        "rejected",
        "cancelled",
    )
    counts = dict.fromkeys(names, 0)
    body = {
        "batch_id": BATCH,
        "state": "running",
        "done": False,
        "counts": {**counts, "total": 2, "pending": 2},
        "status_url": f"/v1/extraction-batches/{BATCH}",
        "items_url": f"/v1/extraction-batches/{BATCH}/items",
        "poll_after_seconds": 5,
        "message": "NOT complete",
    }
    item = {"index": 0, "job_id": JOB, "idempotency_key": "b #0", "state": "SUCCEEDED", "done": True,
            "state_version": 3, "status_url": "/x", "result": {"a": 1}}  # fmt: skip
    script.on("POST /v1/extraction-batches", respond(202, body))
    script.on(f"GET /v1/extraction-batches/{BATCH}", respond(200, body))
    script.on(
        f"GET /v1/extraction-batches/{BATCH}/items",
        respond(200, {"batch_id": BATCH, "items": [item], "next_cursor": "n"}),
        respond(200, {"batch_id": BATCH, "items": [{**item, "index": 1}], "next_cursor": None}),
    )
    with make_client(script) as client:
        batch = client.submit_batch(
            ["one", StoredDocument(JOB, 1, "", 0), {"document": {"text": "x"}, "idempotency_key": "own"}],
            idempotency_key="run-7",
            priority="batch",
        )
        again = client.get_batch(BATCH)
        items = list(client.iter_batch_items(BATCH, state="SUCCEEDED"))
    assert script.seen[0].body == {
        "items": [
            {"document": {"text": "one"}},
            {"document_id": JOB, "document_version": 1},
            {"document": {"text": "x"}, "idempotency_key": "own"},
        ],
        "priority": "batch",
    }
    assert script.seen[0].headers["idempotency-key"] == "run-7" and batch.idempotency_key == "run-7"
    assert (batch.batch_id, batch.done, batch.counts["total"]) == (BATCH, False, 2) and not again.done
    assert [i.index for i in items] == [0, 1] and items[0].result == {"a": 1}


def test_every_httpx_transport_error_is_translated_and_only_unsent_ones_say_so() -> None:
    def subclasses(kind: type) -> set[type]:
        return {kind} | {s for sub in kind.__subclasses__() for s in subclasses(sub)}

    for kind in subclasses(httpx.TransportError):
        translated = translate(kind("x"))
        assert isinstance(translated, TransportError)
        assert translated.sent is not issubclass(kind, _NOT_SENT)


def test_error_mapping_and_retry_after_forms() -> None:
    assert retry_after_seconds("12") == 12
    assert retry_after_seconds("Wed, 01 Jan 2031 00:00:10 GMT", now=1924992000.0) == 10
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None
    weird = error_from_answer(418, "<html>", {})
    assert (weird.status, weird.code) == (418, "http_418")
    body = {"error": {"code": "tenant_quota_exceeded", "message": "m", "retry_after_seconds": 9}}
    assert error_from_answer(429, body, {}).retry_after == 9


def test_the_async_client_has_every_method_of_the_sync_client_and_waits_the_same_way() -> None:
    public = {n for n in dir(Client) if not n.startswith("_")} - {"close"}
    assert public <= {n for n in dir(AsyncClient) if not n.startswith("_")}
    for name in public - {"iter_jobs", "iter_batch_items", "events", "retry", "poll_policy"}:
        assert inspect.iscoroutinefunction(getattr(AsyncClient, name)), name

    time = FakeTime()
    script = Script(time)
    script.on("POST /v1/extraction-jobs", respond(202, accepted()))
    script.on(
        f"GET /v1/extraction-jobs/{JOB}",
        respond(200, status("RUNNING")),
        respond(200, status("SUCCEEDED", result={"a": 1})),
    )

    async def run() -> fatura_sdk.AwaitResult:
        async with AsyncClient(
            "http://fatura.test",
            KEY,
            transport=httpx.MockTransport(script.handler),
            sleep=time.asleep,
            clock=time.clock,
            rng=random.Random(1),
            poll_policy=fatura_sdk.PollPolicy(jitter=0),
        ) as client:
            return await client.start_and_await("text", max_wait=60)

    result = asyncio.run(run())
    assert (result.outcome, result.result, time.sleeps) == ("succeeded", {"a": 1}, [5, 7.5])
