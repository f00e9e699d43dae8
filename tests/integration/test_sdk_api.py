"""The SDK's Client against the real edge and pipeline: documents, jobs, cancel, typed errors,
batches, and events (SSE) followed to the end and resumed from a Last-Event-ID."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fatura_sdk import (
    Client,
    Conflict,
    NotFound,
    ServerEvent,
    Unauthorized,
    ValidationError,
)
from fix_db import TenantHandle
from fix_pipeline import Pipeline, StartPipeline, sample_text

INVOICES = ["01_tr_kirtasiye_try.txt", "02_de_buerotechnik_eur.txt"]
NOT_AN_INVOICE = "Dear team, lunch is at noon on Friday.\n"


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(
        FATURA_EVENT_HEARTBEAT_SECONDS="0.5",
        FATURA_ATTEMPT_DEADLINE_SECONDS="60",
        FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS="60",
    )
    pipeline.start_processing()
    yield pipeline


@pytest.fixture
def tenant(pipe: Pipeline) -> TenantHandle:
    return pipe.make_tenant()


@pytest.fixture
def client(pipe: Pipeline, tenant: TenantHandle) -> Iterator[Client]:
    assert pipe.edge.base_url is not None
    with Client(pipe.edge.base_url, tenant.api_key) as c:
        yield c


def test_an_uploaded_document_is_extracted_by_reference(client: Client) -> None:
    stored = client.upload(sample_text(INVOICES[1]), filename=INVOICES[1])
    result = client.start_and_await(stored, max_wait=60)
    assert (result.outcome, result.state) == ("succeeded", "SUCCEEDED")
    assert result.result is not None and result.result["currency"] == "EUR"
    job = client.get(result.job_id)
    assert job.raw["document"] == {"document_id": stored.document_id, "version": stored.version}


def test_the_apis_refusals_are_typed_errors_with_its_codes(pipe: Pipeline, client: Client) -> None:
    job = client.submit(sample_text(INVOICES[0]), idempotency_key="typed-1")
    with pytest.raises(Conflict) as reused:
        client.submit(NOT_AN_INVOICE, idempotency_key="typed-1")
    assert (reused.value.code, reused.value.job_id) == ("idempotency_key_reused", job.job_id)
    with pytest.raises(ValidationError) as invalid:
        client.submit("text", priority="urgent")
    assert invalid.value.status == 422
    other = pipe.make_tenant()
    assert pipe.edge.base_url is not None
    with Client(pipe.edge.base_url, other.api_key) as stranger, pytest.raises(NotFound) as missing:
        stranger.get(job.job_id)
    assert missing.value.code == "job_not_found"
    with Client(pipe.edge.base_url, "fat_not_a_key") as nobody, pytest.raises(Unauthorized):
        nobody.list()


def test_a_cancelled_job_is_awaited_as_failed_and_cancelling_again_changes_nothing(
    pipe: Pipeline, client: Client
) -> None:
    pipe.fault("hang_before_headers", delay_s=5, count=1)
    job = client.submit(sample_text(INVOICES[0]), priority="interactive")
    cancelled = client.cancel(job.job_id)
    again = client.cancel(job.job_id)
    result = client.await_job(job.job_id, max_wait=10)
    assert (cancelled.state, cancelled.done, again.state) == ("CANCELLED", True, "CANCELLED")
    assert (result.outcome, result.state, result.result) == ("failed", "CANCELLED", None)
    assert [j.job_id for j in client.list(state="CANCELLED").jobs] == [job.job_id]
    pipe.clear_faults()  # cancelled before a worker took it, the job never drew the fault


def test_a_batch_is_followed_to_completed_with_errors_and_its_items_read(client: Client) -> None:
    stored = client.upload(sample_text(INVOICES[1]))
    batch = client.submit_batch(
        [
            sample_text(INVOICES[0]),
            stored,
            {"document": {"text": NOT_AN_INVOICE}, "idempotency_key": "lunch"},
        ],
        idempotency_key="sdk-batch-1",
        priority="interactive",
    )
    assert (batch.state, batch.done, batch.counts["total"]) == ("running", False, 3)
    assert "NOT" in batch.message or "NONE" in batch.message
    replay = client.submit_batch(
        [
            sample_text(INVOICES[0]),
            stored,
            {"document": {"text": NOT_AN_INVOICE}, "idempotency_key": "lunch"},
        ],
        idempotency_key="sdk-batch-1",
        priority="interactive",
    )
    assert replay.batch_id == batch.batch_id and replay.replayed

    deadline = time.monotonic() + 60
    while not (status := client.get_batch(batch.batch_id)).done:
        assert time.monotonic() < deadline, status
        time.sleep(min(2, status.poll_after_seconds or 2))
    assert status.state == "completed_with_errors" and status.errors_url
    assert (status.counts["succeeded"], status.counts["failed"]) == (2, 1)
    items = list(client.iter_batch_items(batch.batch_id))
    assert [i.state for i in items] == ["SUCCEEDED", "SUCCEEDED", "FAILED_TERMINAL"]
    assert items[0].result is not None and items[2].result is None and items[2].error
    (error,) = client.iter_batch_items(batch.batch_id, state="errors")
    assert (error.index, error.idempotency_key) == (2, "lunch")


def test_a_jobs_events_are_followed_until_done(pipe: Pipeline, client: Client) -> None:
    pipe.fault("hang_before_headers", delay_s=2, count=1)
    job = client.submit(sample_text(INVOICES[0]), priority="interactive")
    events = list(client.events(job_id=job.job_id, until_done=True, read_timeout=10))
    assert events[0].event == "snapshot" and events[-1].done
    states = [e.state for e in events[1:]]
    assert states[-1] == "SUCCEEDED" and "RUNNING" in states
    versions = [e.state_version for e in events[1:] if e.state_version is not None]
    assert versions == sorted(versions)


def test_the_tenant_stream_resumes_from_the_last_event_id_it_handed_out(
    pipe: Pipeline, client: Client
) -> None:
    """Given a tenant stream read up to the first event of a job, then closed
    When a new stream opens with that event's id as Last-Event-ID
    Then it replays what came after, without a snapshot, until both jobs are done."""
    pipe.fault("hang_before_headers", delay_s=2, count=1)
    first: list[ServerEvent] = []
    opened = threading.Event()

    def read_one() -> None:
        stream = client.events(read_timeout=10)
        for event in stream:
            opened.set()
            if event.event != "snapshot":
                first.append(event)
                break
        stream.close()

    reader = threading.Thread(target=read_one)
    reader.start()
    assert opened.wait(10)
    jobs = {client.submit(sample_text(name), priority="interactive").job_id for name in INVOICES}
    reader.join(30)
    (cursor,) = first

    replayed: list[ServerEvent] = []
    finished: set[str] = set()
    for event in client.events(last_event_id=cursor.id, read_timeout=10):
        replayed.append(event)
        if event.done and event.job_id:
            finished.add(event.job_id)
        if finished == jobs:
            break
    assert cursor.id is not None
    assert all(e.event != "snapshot" for e in replayed)
    assert all(int(e.id or 0) > int(cursor.id) for e in replayed)
    assert {e.job_id for e in replayed} <= jobs and finished == jobs
