"""The four slow paths of seed 004, through the SDK against the real stack: the edge, relay, limiter,
inference worker and scheduler, the delivery worker and scheduler, and the simulated provider,
slowed at run time by its ``hang_before_headers`` fault (the call waits ``delay_s``, then answers).

1. A slow job: the agent's one tool call waits outside the model loop and returns the result; the
   invoice is submitted once and extracted once.
2. A late failure: the job runs for seconds, then fails; the answer is ``failed`` with the error
   class, never a finished poll mistaken for success.
3. A timeout: ``timed_out`` with the job id and the words NOT complete, no exception, no result; the
   job goes on and the id finds its result later; the agent calling submit again makes no second job.
4. A duplicate completion: two pollers racing on one submission and the webhook, delivered and then
   resent with the same webhook-id, all report one completion; the downstream step runs once.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from fatura_sdk import AwaitResult, Client, Completions, Event, Receiver, generate_secret
from fatura_sdk.agent import CHECK, SUBMIT, InvoiceTools
from fatura_sdk.completions import Step
from fix_db import TenantHandle
from fix_pipeline import Pipeline, StartPipeline, sample_text

SLOW = {
    # The provider is slowed per test by a fault; the attempt and the header wait outlast it.
    "FATURA_ATTEMPT_DEADLINE_SECONDS": "60",
    "FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS": "60",
    # The delivery processes' short timers, and this machine as an allowed webhook target.
    "FATURA_EGRESS_ALLOW": "127.0.0.0/8,::1/128",
    "FATURA_DELIVERY_RETRY_SCALE": "0.002",
    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.1",
    "FATURA_DELIVERY_REWAKE_SECONDS": "2",
}
INVOICE = "01_tr_kirtasiye_try.txt"
NOT_AN_INVOICE = "Dear team, lunch is at noon on Friday.\n"


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(**SLOW)
    pipeline.start_processing(delivery=True)
    yield pipeline


@dataclass
class Seen:
    method: str
    path: str
    status: int
    body: Any


@dataclass
class Recording(httpx.BaseTransport):
    """The real transport, keeping what the SDK sent and what it was answered."""

    inner: httpx.HTTPTransport = field(default_factory=httpx.HTTPTransport)
    seen: list[Seen] = field(default_factory=list)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        content = response.read()
        body = json.loads(content) if content else None
        self.seen.append(Seen(request.method, request.url.path, response.status_code, body))
        return httpx.Response(response.status_code, headers=response.headers, content=content)

    def close(self) -> None:
        self.inner.close()

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST"]

    def polls(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "GET" and s.path.startswith("/v1/extraction-jobs/")]


def _client(pipe: Pipeline, tenant: TenantHandle, recording: Recording) -> Client:
    assert pipe.edge.base_url is not None
    return Client(pipe.edge.base_url, tenant.api_key, transport=recording)


def _jobs(client: Client) -> list[str]:
    return [job.job_id for job in client.iter_jobs()]


def test_a_slow_job_is_awaited_by_one_tool_call_and_submitted_once(pipe: Pipeline) -> None:
    # Given a provider that takes 9 s to answer the next call
    tenant = pipe.make_tenant()
    pipe.fault("hang_before_headers", delay_s=9, count=1)
    calls_before = pipe.provider_requests()
    recording = Recording()
    with _client(pipe, tenant, recording) as client:
        # When the agent calls submit_invoice once, allowing it a minute
        started = time.monotonic()
        answer = InvoiceTools(client).call(SUBMIT, {"text": sample_text(INVOICE), "wait_seconds": 60})
        took = time.monotonic() - started
        jobs = _jobs(client)

    # Then the one answer is the result, after the tool polled while the job was still running
    assert answer["status"] == "succeeded" and answer["done"] is True, answer
    assert answer["state"] == "SUCCEEDED" and answer["result"]["currency"] == "TRY"
    assert answer["message"].startswith("COMPLETE") and answer["next_action"] == "use_result"
    polls = recording.polls()
    assert polls[0].body["done"] is False and polls[0].body["state"] in ("READY", "RUNNING")
    assert polls[-1].body["done"] is True and len(polls) >= 2 and took >= 9
    # And the invoice was submitted once, is one job, and was extracted by one provider call
    assert len(recording.posts()) == 1
    assert jobs == [answer["job_id"]]
    assert pipe.provider_requests() - calls_before == 1


def test_a_late_failure_is_reported_as_failed_with_its_error_class(pipe: Pipeline) -> None:
    # Given a document that is not an invoice, whose slow extraction fails after 8 s
    tenant = pipe.make_tenant()
    pipe.fault("hang_before_headers", delay_s=8, count=1)
    recording = Recording()
    with _client(pipe, tenant, recording) as client:
        # When it is submitted and awaited
        result = client.start_and_await(NOT_AN_INVOICE, max_wait=90)
        tools_answer = InvoiceTools(client).call(CHECK, {"job_id": result.job_id, "wait_seconds": 0})

    # Then the answer is failed, with the error class, after polls that saw it still running
    assert (result.outcome, result.state, result.done) == ("failed", "FAILED_TERMINAL", True)
    assert result.error is not None and result.error["class"], result.error
    assert result.result is None and not result.succeeded
    assert result.error["class"] in result.message and "do not report success" in result.message
    polls = recording.polls()
    assert [p.body["done"] for p in polls][:1] == [False] and polls[-1].body["state"] == "FAILED_TERMINAL"
    # And the agent's check says FAILED and to report it, never COMPLETE
    assert (tools_answer["status"], tools_answer["next_action"]) == ("failed", "report_failure")
    assert tools_answer["error"]["class"] == result.error["class"] and "result" not in tools_answer


def test_a_timeout_returns_timed_out_with_the_job_id_and_the_job_goes_on(pipe: Pipeline) -> None:
    # Given a provider that takes 15 s to answer the next call
    tenant = pipe.make_tenant()
    pipe.fault("hang_before_headers", delay_s=15, count=1)
    recording = Recording()
    with _client(pipe, tenant, recording) as client:
        # When the SDK may wait only 7 s
        started = time.monotonic()
        result = client.start_and_await(sample_text(INVOICE), max_wait=7, idempotency_key="slow-184")
        waited = time.monotonic() - started
        # And the agent, told it is not complete, calls submit_invoice again with the same invoice
        tools = InvoiceTools(client)
        again = tools.call(
            SUBMIT, {"text": sample_text(INVOICE), "idempotency_key": "slow-184", "wait_seconds": 0}
        )
        # And later checks the job by its id
        later = tools.call(CHECK, {"job_id": result.job_id, "wait_seconds": 60})
        jobs = _jobs(client)

    # Then the wait ended at its limit with timed_out: no exception, no result, the job id, NOT complete
    assert isinstance(result, AwaitResult) and result.outcome == "timed_out"
    assert result.job_id and result.state in ("READY", "RUNNING") and result.done is False
    assert result.result is None and not result.succeeded
    assert "NOT complete" in result.message and result.job_id in result.message
    assert 7 <= waited < 12
    # And the second submission is the same job, still not complete; no second job exists
    assert (again["status"], again["job_id"], again["done"]) == ("timed_out", result.job_id, False)
    assert "NOT complete" in again["message"] and CHECK in again["message"]
    assert jobs == [result.job_id]
    # And the id finds the result once the slow call answers
    assert (later["status"], later["job_id"], later["done"]) == ("succeeded", result.job_id, True)


@dataclass
class WebhookReceiver:
    """The SDK's Receiver behind a local HTTP server, as a partner runs it."""

    receiver: Receiver
    secret: str
    url: str


def _books_step(job_id: str, state_version: int, result: dict[str, Any] | None, source: str) -> Step:
    """The downstream step: the invoice on the books, one row per job completion."""

    def step(conn: sqlite3.Connection) -> None:
        total = ((result or {}).get("totals") or {}).get("grand_total")
        conn.execute("INSERT INTO books VALUES (?, ?, ?, ?)", (job_id, state_version, str(total), source))

    return step


@pytest.fixture
def books(tmp_path: Path) -> Iterator[Completions]:
    completions = Completions(tmp_path / "completions.sqlite")
    with completions.connection() as conn:
        conn.execute("CREATE TABLE books (job_id TEXT, state_version INTEGER, total TEXT, source TEXT)")
    yield completions
    completions.close()


@pytest.fixture
def webhooks(books: Completions, tmp_path: Path) -> Iterator[WebhookReceiver]:
    secret = generate_secret()

    def apply(conn: sqlite3.Connection, event: Event) -> None:
        if event.type == "extraction.completed.v1":
            data = event.data
            step = _books_step(data["job_id"], data["state_version"], data.get("result"), "webhook")
            books.run_once(data["job_id"], data["state_version"], step, state=data["state"], source="webhook")

    receiver = Receiver(secret, tmp_path / "inbox.sqlite", apply)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            answer = receiver.handle(dict(self.headers.items()), body)
            payload = json.dumps(answer.body).encode()
            self.send_response(answer.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield WebhookReceiver(receiver, secret, f"http://127.0.0.1:{server.server_address[1]}/webhooks")
    server.shutdown()
    server.server_close()
    receiver.close()


def _deliveries(http: httpx.Client, tenant: TenantHandle, job_id: str) -> list[dict[str, Any]]:
    reply = http.get("/v1/deliveries", params={"job_id": job_id}, headers=tenant.headers)
    assert reply.status_code == 200, reply.text
    found: list[dict[str, Any]] = reply.json()["deliveries"]
    return found


def _wait(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_completion_seen_four_times_runs_the_downstream_step_once(
    pipe: Pipeline, webhooks: WebhookReceiver, books: Completions
) -> None:
    # Given a tenant whose webhooks go to a partner's SDK Receiver
    tenant = pipe.make_tenant()
    http = pipe.client()
    reply = http.post(
        "/v1/webhook-endpoints", json={"url": webhooks.url, "secret": webhooks.secret}, headers=tenant.headers
    )
    assert reply.status_code == 201, reply.text
    # And a job slow enough that two pollers of the same submission both wait for it
    pipe.fault("hang_before_headers", delay_s=3, count=1)
    results: list[AwaitResult] = []

    def poller() -> None:
        with _client(pipe, tenant, Recording()) as client:
            result = client.start_and_await(sample_text(INVOICE), max_wait=60, idempotency_key="inv-2026-7")
        results.append(result)
        step = _books_step(result.job_id, result.state_version or 0, result.result, "poll")
        books.handle(result, step, source="poll")

    # When both see it complete, each hands the completion to the downstream step
    threads = [threading.Thread(target=poller) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert [r.outcome for r in results] == ["succeeded", "succeeded"]
    job_id, version = results[0].job_id, results[0].state_version
    assert results[1].job_id == job_id and results[1].state_version == version
    # And the webhook of the same completion arrives, and is then resent with the same webhook-id
    delivery = _wait(
        lambda: next((d for d in _deliveries(http, tenant, job_id) if d["state"] == "delivered"), None),
        "the completion's webhook to be delivered",
    )
    resent = http.post(f"/v1/deliveries/{delivery['delivery_id']}:resend", headers=tenant.headers)
    assert resent.status_code == 200, resent.text
    _wait(lambda: webhooks.receiver.stats()["duplicate"] == 1, "the resend to reach the receiver")

    # Then the downstream step ran exactly once for the four sightings
    with books.connection() as conn:
        rows = [tuple(r) for r in conn.execute("SELECT job_id, state_version, source FROM books")]
    assert len(rows) == 1 and rows[0][:2] == (job_id, version)
    # Two polls and the first webhook reached the step's guard; the resend stopped at the inbox
    assert books.sightings(job_id, version or 0) == 3
    stats = webhooks.receiver.stats()
    assert (stats["accepted"], stats["duplicate"]) == (1, 1)
    assert [d["delivery_id"] for d in _deliveries(http, tenant, job_id)] == [delivery["delivery_id"]]
    http.close()
