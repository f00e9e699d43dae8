"""The inference pipeline end to end: HTTP edge → outbox → RabbitMQ → inference worker → simulated
provider → validation → fenced completion, all as real processes."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import dramatiq
import pika
import pytest

from fix_amqp import AMQP_URL
from fix_ops import make_operator
from fix_pipeline import TERMINAL, Pipeline, StartPipeline
from services.common.broker import make_broker
from services.common.settings import CommonSettings
from services.inference.validation import resolve_span
from services.sandbox.samples import SAMPLES_DIR, load_samples


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory()
    pipeline.start_processing()
    yield pipeline


@pytest.fixture(autouse=True)
def no_faults(pipe: Pipeline) -> Iterator[None]:
    pipe.clear_faults()
    yield
    pipe.clear_faults()


def test_every_sample_invoice_ends_in_its_expected_state_with_its_reasons(pipe: Pipeline) -> None:
    # Given a tenant with supplier master data, when every sample invoice is submitted
    tenant = pipe.make_tenant()
    samples = load_samples()
    manifest = json.loads((SAMPLES_DIR / "manifest.json").read_text(encoding="utf-8"))
    expected_reasons = {entry["file"]: set(entry.get("reasons", [])) for entry in manifest}
    jobs = {sample.filename: pipe.submit(tenant, sample.text) for sample in samples}
    # Then each ends in the state its manifest entry names, after one attempt
    for sample in samples:
        job = pipe.wait_state(jobs[sample.filename], TERMINAL)
        assert job["state"] == sample.expect, (sample.filename, job["state"], job["review_reasons"])
        assert job["attempt"] == 1
        assert job["result"]["schema"] == "invoice.v1"
        assert job["policy_version"]
        # the stored result keeps its evidence as spans into the stored text
        for pointer, span in job["result"]["evidence"].items():
            assert resolve_span(sample.text, span), (sample.filename, pointer, span)
        if sample.expect == "REVIEW_REQUIRED":
            codes = {reason["code"] for reason in job["review_reasons"]}
            assert expected_reasons[sample.filename] <= codes, (sample.filename, codes)
            assert all(reason["message"] for reason in job["review_reasons"])
        else:
            assert job["review_reasons"] is None
    # And the status a customer reads carries the result, the reasons and the policy version
    with pipe.client() as c:
        body = c.get(f"/v1/extraction-jobs/{jobs[samples[0].filename]}", headers=tenant.headers).json()
    assert body["done"] is True
    assert body["result"]["currency"] == "TRY"
    assert body["policy_version"]
    assert resolve_span(samples[0].text, body["result"]["evidence"]["/total"]) == "12.540,00"


def test_a_plain_invoice_the_samples_do_not_know_is_read_not_failed(pipe: Pipeline) -> None:
    # Given the plain Turkish invoice of issue 11 (point 6), whose supplier the tenant does not know
    text = (
        Path(__file__).resolve().parents[1] / "unit" / "provider_dev_cases" / "d01_tr_issue_example.txt"
    ).read_text(encoding="utf-8")
    tenant = pipe.make_tenant()
    # When it is submitted
    job = pipe.wait_state(pipe.submit(tenant, text), TERMINAL)
    # Then it is read in one attempt and waits for a person only because the supplier is unknown,
    # never FAILED_TERMINAL for a schema violation
    assert (job["state"], job["attempt"]) == ("REVIEW_REQUIRED", 1)
    assert {reason["code"] for reason in job["review_reasons"]} == {"supplier_unknown"}
    assert (job["result"]["invoice_number"], len(job["result"]["lines"])) == ("INV-2026-0042", 2)


def _publish_raw(queue: str, body: bytes) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def _requested_event(pipe: Pipeline, job_id: str) -> dict[str, object]:
    with pipe.pool.connection() as conn:
        row = conn.execute(
            "SELECT payload FROM outbox_events WHERE job_id = %s AND event_type = 'extraction.requested.v1'",
            (job_id,),
        ).fetchone()
    assert row is not None
    return dict(row["payload"])


def _send_event(pipe: Pipeline, event: dict[str, object]) -> None:
    broker = make_broker(CommonSettings(amqp_url=AMQP_URL))
    try:
        broker.enqueue(
            dramatiq.Message(
                queue_name=f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest",
                actor_name="ingest",
                args=(),
                kwargs={"event": event},
                options={},
            )
        )
    finally:
        broker.close()


def test_the_same_requested_event_delivered_twice_runs_the_job_once(pipe: Pipeline) -> None:
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[0].text)
    pipe.wait_state(job_id, TERMINAL)
    calls = pipe.provider_requests()
    # When the broker delivers the same event again (a relay that crashed after the confirm)
    event = _requested_event(pipe, job_id)
    _send_event(pipe, event)
    _send_event(pipe, event)
    time.sleep(1.5)
    # Then the job is not run again: one attempt, no new provider call, one inbox row
    job = pipe.job(job_id)
    assert job["attempt"] == 1
    assert len(pipe.attempts(job_id)) == 1
    assert pipe.provider_requests() == calls
    with pipe.pool.connection() as conn:
        inbox = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert inbox is not None and inbox["n"] == 1


def test_an_event_id_seen_again_with_another_payload_is_quarantined_not_applied(pipe: Pipeline) -> None:
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[0].text)
    pipe.wait_state(job_id, TERMINAL)
    event = _requested_event(pipe, job_id)
    forged = {**event, "state_version": 7}
    _send_event(pipe, forged)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with pipe.pool.connection() as conn:
            row = conn.execute(
                "SELECT * FROM inbox_quarantine WHERE inbox = 'execution_inbox' AND event_id = %s",
                (event["event_id"],),
            ).fetchone()
        if row is not None:
            break
        time.sleep(0.1)
    assert row is not None, "the conflicting event was not quarantined"
    assert row["payload"]["state_version"] == 7
    assert pipe.job(job_id)["attempt"] == 1
    # And the refused message is a dead letter an operator sees, with its reason
    deadline = time.monotonic() + 10
    letter = None
    while time.monotonic() < deadline and letter is None:
        with pipe.pool.connection() as conn:
            letter = conn.execute(
                "SELECT reason FROM dead_letters WHERE message -> 'kwargs' -> 'event' ->> 'event_id' = %s",
                (event["event_id"],),
            ).fetchone()
        time.sleep(0.1)
    assert letter is not None and letter["reason"] == "digest_conflict"


def _publish_message(queue: str, kwargs: dict[str, object], message_id: str) -> None:
    message = {
        "queue_name": queue,
        "actor_name": "ingest",
        "args": [],
        "kwargs": kwargs,
        "options": {},
        "message_id": message_id,
        "message_timestamp": int(time.time() * 1000),
    }
    _publish_raw(queue, json.dumps(message).encode())


def _dead_letters(
    pipe: Pipeline, message_ids: list[str], timeout: float = 20.0
) -> dict[str, dict[str, object]]:
    deadline = time.monotonic() + timeout
    found: dict[str, dict[str, object]] = {}
    while time.monotonic() < deadline and len(found) < len(message_ids):
        with pipe.pool.connection() as conn:
            rows = conn.execute(
                "SELECT * FROM dead_letters WHERE message_id = ANY(%s)", (message_ids,)
            ).fetchall()
        found = {str(row["message_id"]): dict(row) for row in rows}
        time.sleep(0.1)
    return found


def test_a_message_of_several_events_takes_each_in_and_dead_letters_only_the_bad_ones_alone(
    pipe: Pipeline,
) -> None:
    # Given two finished jobs; B's event is forgotten by the inbox, so it is new again
    tenant = pipe.make_tenant()
    job_a = pipe.submit(tenant, load_samples()[0].text)
    job_b = pipe.submit(tenant, load_samples()[1].text)
    pipe.wait_state(job_a, TERMINAL)
    pipe.wait_state(job_b, TERMINAL)
    event_a, event_b = _requested_event(pipe, job_a), _requested_event(pipe, job_b)
    with pipe.pool.connection() as conn:
        conn.execute("DELETE FROM execution_inbox WHERE event_id = %s", (event_b["event_id"],))
    unknown_id = str(uuid.uuid4())
    forged = {**event_a, "state_version": 7}
    # When one message carries A again, B, an event of a type nobody reads, and A forged
    queue = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    pack_id = str(uuid.uuid4())
    events = [event_a, event_b, {"event_type": "invoice.paid.v1", "event_id": unknown_id}, forged]
    _publish_message(queue, {"events": events}, pack_id)
    # Then the two bad events are dead letters of their own, each as the message it would have been
    letters = _dead_letters(pipe, [unknown_id, str(event_a["event_id"])])
    assert {key: row["reason"] for key, row in letters.items()} == {
        unknown_id: "unknown_type",
        str(event_a["event_id"]): "digest_conflict",
    }
    assert letters[unknown_id]["message"]["kwargs"] == {"event": events[2]}  # type: ignore[index]
    assert letters[str(event_a["event_id"])]["message"]["kwargs"] == {"event": forged}  # type: ignore[index]
    # And B was taken in again, A counted once, neither job ran again, and the message itself is no
    # dead letter
    deadline = time.monotonic() + 10
    with pipe.pool.connection() as conn:
        while time.monotonic() < deadline:
            taken = conn.execute(
                "SELECT count(*) AS n FROM execution_inbox WHERE event_id = %s", (event_b["event_id"],)
            ).fetchone()
            if taken is not None and taken["n"] == 1:
                break
            time.sleep(0.1)
        assert taken is not None and taken["n"] == 1
        rows = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox WHERE job_id = %s", (job_a,)
        ).fetchone()
        assert rows is not None and rows["n"] == 1
        whole = conn.execute(
            "SELECT count(*) AS n FROM dead_letters WHERE message_id = %s", (pack_id,)
        ).fetchone()
        assert whole is not None and whole["n"] == 0
    assert pipe.job(job_a)["attempt"] == 1 and pipe.job(job_b)["attempt"] == 1
    assert len(pipe.attempts(job_a)) == 1 and len(pipe.attempts(job_b)) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"events": []},
        {"events": "not a list"},
        {"events": [{"event_type": "invoice.paid.v1"}] * 65},
        {"event": {"event_type": "invoice.paid.v1"}, "events": [{"event_type": "invoice.paid.v1"}]},
    ],
)
def test_a_message_whose_events_cannot_be_read_is_dead_lettered_whole(
    pipe: Pipeline, kwargs: dict[str, object]
) -> None:
    queue = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    message_id = str(uuid.uuid4())
    _publish_message(queue, kwargs, message_id)
    letters = _dead_letters(pipe, [message_id])
    assert letters[message_id]["reason"] == "malformed"


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ({"event": "not an object"}, "malformed"),
        (
            {"event": {"event_type": "extraction.requested.v9", "event_id": str(uuid.uuid4())}},
            "unknown_version",
        ),
        ({"event": {"event_type": "invoice.paid.v1"}}, "unknown_type"),
        ({"event": {"event_type": "extraction.requested.v1", "padding": "x" * 20_000}}, "too_large"),
        (
            {
                "event": {
                    "event_type": "extraction.requested.v1",
                    "event_id": "nope",
                    "tenant_id": "x",
                    "job_id": "y",
                    "state": "READY",
                    "state_version": 1,
                }
            },
            "malformed",
        ),
    ],
)
def test_a_bad_broker_message_is_dead_lettered_with_its_reason_and_the_worker_goes_on(
    pipe: Pipeline, body: dict[str, object], reason: str
) -> None:
    queue = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    message_id = str(uuid.uuid4())
    _publish_message(queue, body, message_id)
    deadline = time.monotonic() + 20
    row = None
    while time.monotonic() < deadline and row is None:
        with pipe.pool.connection() as conn:
            row = conn.execute("SELECT * FROM dead_letters WHERE message_id = %s", (message_id,)).fetchone()
        time.sleep(0.1)
    assert row is not None, "the refusal was not recorded"
    assert row["reason"] == reason
    # And the worker is alive and still runs good jobs
    assert all(worker.alive() for worker in pipe.workers)
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[0].text)
    assert pipe.wait_state(job_id, TERMINAL)["state"] == "SUCCEEDED"


def test_a_message_that_is_not_even_json_is_dead_lettered_and_the_queue_keeps_moving(pipe: Pipeline) -> None:
    queue = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    with pipe.pool.connection() as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) AS id FROM dead_letters").fetchone()
    assert before is not None
    _publish_raw(queue, b"\x00\x01 not json at all")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[1].text)
    assert pipe.wait_state(job_id, TERMINAL)["state"] == "SUCCEEDED"
    assert all(worker.alive() for worker in pipe.workers)
    # Dramatiq cannot decode it, so RabbitMQ dead-letters it; the scheduler moves it into
    # dead_letters with what it was, and leaves the dead-letter queue empty
    deadline = time.monotonic() + 30
    row = None
    while time.monotonic() < deadline and row is None:
        with pipe.pool.connection() as conn:
            row = conn.execute(
                "SELECT * FROM dead_letters WHERE id > %s AND queue = %s", (before["id"], queue)
            ).fetchone()
        time.sleep(0.2)
    assert row is not None, "the undecodable message never reached dead_letters"
    assert (row["source"], row["reason"], row["message"]) == ("broker", "undecodable", None)
    assert "not json at all" in row["body"]
    broker = make_broker(CommonSettings(amqp_url=AMQP_URL))
    try:
        assert broker.get_queue_message_counts(queue)[2] == 0
    finally:
        broker.close()


def test_a_provider_answer_that_is_not_json_is_an_attempt_outcome_and_the_job_is_retried(
    pipe: Pipeline,
) -> None:
    pipe.fault("broken_json", count=1)
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[0].text)
    job = pipe.wait_state(job_id, TERMINAL)
    assert job["state"] == "SUCCEEDED"
    assert job["attempt"] == 2
    attempts = pipe.attempts(job_id)
    assert [a["outcome"] for a in attempts] == ["broken_json", "ok"]
    # And the job's usage is the sum over both calls: the broken answer may be billed too
    assert all(a["input_tokens"] and a["output_tokens"] for a in attempts)
    assert job["usage"]["input_tokens"] == sum(a["input_tokens"] for a in attempts)
    assert job["usage"]["output_tokens"] == sum(a["output_tokens"] for a in attempts)
    assert job["usage"]["total_tokens"] == sum(a["input_tokens"] + a["output_tokens"] for a in attempts)


def test_a_provider_error_naming_its_hosts_reaches_the_operator_and_never_the_tenant(
    pipe: Pipeline,
) -> None:
    # Given a provider whose every answer is a 503 whose text names its own host, port and pid
    raw = "gpu-node-17.provider.internal:8443 (pid 4711) lost its CUDA context"
    pipe.fault("server_error", count=None, status=503, message=raw)
    tenant, operator = pipe.make_tenant(), make_operator(pipe.pool, label="pipeline")
    # When a job spends its retry budget on it
    job_id = pipe.submit(tenant, load_samples()[0].text)
    job = pipe.wait_state(job_id, TERMINAL)
    with pipe.client() as client:
        status = client.get(f"/v1/extraction-jobs/{job_id}", headers=tenant.headers)
        ops = client.get(f"/v1/ops/jobs/{job_id}", headers=operator.headers)
    # Then the tenant reads a stable class and words written for it, and nothing of the provider's
    assert job["state"] == "FAILED_TERMINAL" and raw in job["error_message"]
    assert status.json()["error"]["class"] == "server_error"
    for secret in ("gpu-node-17", "8443", "4711", "CUDA", job["claimed_by"]):
        assert secret not in status.text
    # And the operator reads every attempt with the provider's own words and the worker that made it
    assert ops.status_code == 200, ops.text
    sent = [a for a in ops.json()["attempts"] if a["status"] == "server_error"]
    assert len(sent) >= 2 and {a["attempt"] for a in sent} == set(range(1, job["attempt"] + 1))
    assert all(raw in a["error_message"] and a["http_status"] == 503 for a in sent)
    assert all(a["worker_id"] == job["claimed_by"] and a["channel"] and a["model"] for a in sent)
    assert raw in ops.json()["error"]["message"]


@pytest.mark.parametrize("mode", ["hallucinated_iban", "obey_injection"])
def test_a_model_that_invents_or_obeys_the_document_never_reaches_succeeded(
    pipe: Pipeline, mode: str
) -> None:
    # Given a model that answers with an IBAN the invoice does not state (or the one an injected
    # instruction asks for), when the invoices with an IBAN are extracted
    pipe.fault(mode)
    tenant = pipe.make_tenant()
    samples = [s for s in load_samples() if "IBAN" in s.text]
    if mode == "obey_injection":  # only a document that carries an instruction can be obeyed
        samples = [s for s in samples if "instruction" in s.why]
    assert samples
    jobs = [pipe.submit(tenant, s.text) for s in samples]
    # Then none of them ends SUCCEEDED: validation sends them to review with an IBAN reason
    for job_id in jobs:
        job = pipe.wait_state(job_id, TERMINAL)
        assert job["state"] == "REVIEW_REQUIRED"
        codes = {reason["code"] for reason in job["review_reasons"]}
        assert codes & {
            "iban_mismatch",
            "iban_checksum",
            "evidence_missing",
            "iban_ambiguous",
            "evidence_in_instruction",
        }
