"""One trace per job across every process (issue 13, point 1).

Each process exports its spans to one shared file as JSON lines (``FATURA_TRACE_FILE``): an
in-memory exporter lives in one process, and this trace crosses the edge (or the JobService), the
relay, the limiter, the inference worker and the delivery worker, and reaches the receiver through
the webhook's ``traceparent``.
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest

from fix_pipeline import Pipeline, StartPipeline, sample_text
from fix_processes import SpawnFn
from services.common.procs import free_port
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

DELIVERY_ENV = {
    "FATURA_EGRESS_ALLOW": "127.0.0.0/8,::1/128",
    "FATURA_DELIVERY_RETRY_SCALE": "0.002",
    "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS": "0.1",
    "FATURA_DELIVERY_REWAKE_SECONDS": "2",
}


class Receiver:
    """A webhook receiver that answers 204 and keeps each request's headers and body."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                received.append(({k.lower(): v for k, v in self.headers.items()}, json.loads(body or b"{}")))
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def for_job(self, job_id: str) -> list[dict[str, str]]:
        return [headers for headers, body in list(self.received) if json.dumps(body).find(job_id) >= 0]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def trace_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("traces") / "spans.jsonl"


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline, spawn: SpawnFn, trace_file: Path) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(FATURA_TRACE_FILE=str(trace_file), **DELIVERY_ENV)
    pipeline.start_worker()
    port = free_port()
    delivery = spawn("delivery-worker", **{**pipeline.env, "FATURA_DELIVERY_WORKER_METRICS_PORT": str(port)})
    delivery.wait_ready(f"http://127.0.0.1:{port}/readyz")
    pipeline.others.append(delivery)
    yield pipeline


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _spans(trace_file: Path, trace_id: str) -> list[dict[str, Any]]:
    if not trace_file.exists():
        return []
    lines = trace_file.read_text(encoding="utf-8").splitlines()
    return [s for s in map(json.loads, lines) if s["trace_id"] == trace_id]


def _wait(condition: Any, what: str, timeout: float = 30.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_one_jobs_spans_from_every_process_share_the_trace_its_request_started(
    pipe: Pipeline, receiver: Receiver, trace_file: Path
) -> None:
    # Given a tenant whose webhook endpoint is a receiver of this test
    tenant = pipe.make_tenant()
    with pipe.client() as http:
        reply = http.post("/v1/webhook-endpoints", json={"url": receiver.url}, headers=tenant.headers)
        assert reply.status_code == 201, reply.text
        # When a job is submitted by a caller that is itself traced
        trace_id = secrets.token_hex(16)
        reply = http.post(
            "/v1/extraction-jobs",
            json={"document": {"text": sample_text("01_tr_kirtasiye_try.txt"), "filename": "a.txt"}},
            headers={
                **tenant.headers,
                "Idempotency-Key": f"k-{uuid.uuid4()}",
                "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
            },
        )
        assert reply.status_code == 202, reply.text
    job_id = str(reply.json()["job_id"])
    pipe.wait_state(job_id, {"SUCCEEDED"})

    # Then the webhook that delivers its result carries the same trace to the receiver
    [headers, *_] = _wait(lambda: receiver.for_job(job_id), "the job's webhook")
    assert headers["traceparent"].split("-")[1] == trace_id

    # And the edge, the relay, the limiter, the inference worker and the delivery worker each
    # recorded spans in it
    wanted = {
        "fatura-http",
        "fatura-relay",
        "fatura-limiter",
        "fatura-inference-worker",
        "fatura-delivery-worker",
    }

    # A span is written when it ends: the webhook attempt's ends after the receiver got the POST,
    # while the delivery worker's ingest span was written long before (CI once read the file in
    # between). Wait for every span asserted below.
    names_wanted = {"limiter acquire", "LimiterService/Acquire", "inference attempt", "validation"}
    names_wanted |= {"webhook attempt"}

    def all_there() -> list[dict[str, Any]]:
        spans = _spans(trace_file, trace_id)
        names = {s["name"] for s in spans}
        ready = wanted <= {s["service"] for s in spans} and names_wanted <= names
        return spans if ready and any(n.startswith("provider ") for n in names) else []

    spans = _wait(all_there, f"spans of trace {trace_id} from {sorted(wanted)}")
    assert len({(s["service"], s["pid"]) for s in spans}) >= 5
    names = {s["name"] for s in spans}
    assert {"limiter acquire", "LimiterService/Acquire", "inference attempt", "validation"} <= names
    assert "webhook attempt" in names
    assert any(n.startswith("provider ") for n in names)
    assert any(n.startswith("publish extraction.requested") for n in names)
    [attempt] = [s for s in spans if s["name"] == "inference attempt"]
    assert attempt["attributes"]["job_id"] == job_id
    [hop] = [s for s in spans if s["name"].startswith("provider ")]
    assert hop["parent_span_id"] == attempt["span_id"]
    assert {"channel", "model", "outcome", "gen_ai.usage.input_tokens"} <= set(hop["attributes"])
    # Every span but the caller's own root has its parent inside the trace (nothing is detached)
    ids = {s["span_id"] for s in spans}
    roots = [s for s in spans if s["parent_span_id"] not in ids]
    assert [r["service"] for r in roots] == ["fatura-http"]


def test_a_job_submitted_over_grpc_continues_the_callers_trace(
    pipe: Pipeline, spawn: SpawnFn, trace_file: Path
) -> None:
    # Given the JobService beside the pipeline
    port, metrics_port = free_port(), free_port()
    service = spawn(
        "jobs-grpc",
        **{
            **pipe.env,
            "FATURA_JOBS_GRPC_PORT": str(port),
            "FATURA_JOBS_GRPC_METRICS_PORT": str(metrics_port),
        },
    )
    service.wait_ready(f"http://127.0.0.1:{metrics_port}/readyz")
    pipe.others.append(service)
    tenant = pipe.make_tenant()
    # When a traced caller submits a job with traceparent in the call's metadata
    trace_id = secrets.token_hex(16)
    metadata = (
        ("authorization", f"Bearer {tenant.api_key}"),
        ("traceparent", f"00-{trace_id}-{secrets.token_hex(8)}-01"),
    )
    request = pb.SubmitRequest(
        idempotency_key=f"k-{uuid.uuid4()}",
        document=pb.InlineDocument(text=sample_text("01_tr_kirtasiye_try.txt"), filename="a.txt"),
    )
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        job_id = pb_grpc.JobServiceStub(channel).Submit(request, metadata=metadata, timeout=10).job_id
    pipe.wait_state(job_id, {"SUCCEEDED"})

    # Then the JobService's span and the worker's attempt are in the caller's trace
    def found() -> set[tuple[str, str]]:
        pairs = {(s["service"], s["name"]) for s in _spans(trace_file, trace_id)}
        wanted = {("fatura-jobs-grpc", "JobService/Submit"), ("fatura-inference-worker", "inference attempt")}
        return pairs if wanted <= pairs else set()

    _wait(found, f"the JobService's and the worker's spans in trace {trace_id}")
