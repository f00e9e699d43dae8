"""Trace context and log lines without a server (issue 13, points 1 and 2): the W3C traceparent is
passed on, checked and exported; log records carry the job's fields and its trace id."""

from __future__ import annotations

import io
import json
import logging
import secrets
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.common import logs, tracing
from services.common.messages import parse_event
from services.common.settings import CommonSettings, SettingsError
from services.common.uow import JobChange


def _traceparent() -> tuple[str, str]:
    trace_id = secrets.token_hex(16)
    return trace_id, f"00-{trace_id}-{secrets.token_hex(8)}-01"


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Spans recorded in memory by a provider of this test's own (the global one is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(tracing, "_TRACER", provider.get_tracer("test"))
    monkeypatch.setattr(tracing, "_enabled", True)
    yield exporter
    provider.shutdown()


def test_with_tracing_off_an_incoming_traceparent_is_passed_on_unchanged() -> None:
    _, incoming = _traceparent()
    with tracing.span("anything", incoming):
        assert tracing.current_traceparent() == incoming
    assert tracing.current_traceparent() is None


@pytest.mark.parametrize(
    "incoming",
    [
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # refused: all-zero trace id
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  # refused: all-zero span id
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # refused: version ff
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # not well-formed: ignored
        None,
    ],
)
def test_with_tracing_off_a_span_makes_current_what_the_no_op_tracer_would(incoming: str | None) -> None:
    """The untraced path sets the parent's context itself; the API's no-op tracer is the reference,
    inside an outer span and alone, and in the log fields' trace id."""
    _, outer = _traceparent()

    def seen(use_the_api: bool) -> list[object]:
        def inner() -> list[object]:
            if use_the_api:
                context = tracing.parent_context(incoming)
                with tracing._TRACER.start_as_current_span("x", context=context):
                    return [tracing.current_traceparent(), logs.context_fields().get("trace_id")]
            with tracing.span("x", incoming):
                return [tracing.current_traceparent(), logs.context_fields().get("trace_id")]

        alone = inner()
        with tracing.span("outer", outer):
            nested = inner()
            after = tracing.current_traceparent()
        return [*alone, *nested, after, tracing.current_traceparent()]

    assert not tracing.enabled()
    assert seen(use_the_api=False) == seen(use_the_api=True)


def test_a_span_continues_another_processes_trace_and_names_itself_to_the_next(
    recorded: InMemorySpanExporter,
) -> None:
    trace_id, incoming = _traceparent()
    with tracing.span("inference attempt", incoming, {"job_id": "j"}):
        outgoing = tracing.current_traceparent()
        tracing.record_span(
            "provider primary",
            datetime.now(UTC) - timedelta(seconds=1),
            datetime.now(UTC),
            {"channel": "primary", "gen_ai.usage.input_tokens": 12},
        )
    hop, attempt = recorded.get_finished_spans()
    assert format(attempt.context.trace_id, "032x") == trace_id
    assert attempt.parent is not None and format(attempt.parent.span_id, "016x") == incoming.split("-")[2]
    assert outgoing == f"00-{trace_id}-{format(attempt.context.span_id, '016x')}-01"
    assert hop.parent is not None and hop.parent.span_id == attempt.context.span_id
    assert hop.attributes == {"channel": "primary", "gen_ai.usage.input_tokens": 12}


@pytest.mark.parametrize("bad", [None, 7, "", "00-xyz", "00-" + "0" * 31 + "-" + "1" * 16 + "-01"])
def test_a_malformed_traceparent_is_ignored_and_a_new_trace_begins(
    recorded: InMemorySpanExporter, bad: object
) -> None:
    assert tracing.valid(bad) is None
    with tracing.span("root", tracing.valid(bad)):
        pass
    [root] = recorded.get_finished_spans()
    assert root.parent is None


def test_the_event_carries_the_trace_and_a_bad_one_never_makes_it_poison() -> None:
    _, traceparent = _traceparent()
    change = JobChange(
        uuid.uuid4(), uuid.uuid4(), "READY", 1, "extraction.requested.v1", traceparent=traceparent
    )
    payload = change.params()["payload"].obj
    assert parse_event(payload, {"extraction.requested.v1"}).traceparent == traceparent
    bad = {**payload, "traceparent": "garbage"}
    assert parse_event(bad, {"extraction.requested.v1"}).traceparent is None
    untraced = JobChange(uuid.uuid4(), uuid.uuid4(), "READY", 1, "extraction.requested.v1").params()
    assert "traceparent" not in untraced["payload"].obj


def test_the_file_exporter_writes_one_json_line_per_span(tmp_path: Path) -> None:
    exporter = tracing.JsonLinesExporter(str(tmp_path / "spans.jsonl"))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("one", attributes={"job_id": "j"}):
        pass
    provider.shutdown()
    [line] = (tmp_path / "spans.jsonl").read_text().splitlines()
    span = json.loads(line)
    assert span["name"] == "one" and span["attributes"] == {"job_id": "j"} and len(span["trace_id"]) == 32


def test_an_unknown_exporter_is_a_bad_setting() -> None:
    with pytest.raises(SettingsError, match="OTEL_TRACES_EXPORTER"):
        tracing.setup("test", env={"OTEL_TRACES_EXPORTER": "zipkin"})
    assert tracing.setup("test", env={}) is False or tracing.enabled()


def _log_through(log_format: str, stream: io.StringIO) -> logging.Logger:
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.formatter_for(log_format, stream))
    handler.addFilter(logs._WithContext())
    logger = logging.getLogger(f"test.{uuid.uuid4().hex}")
    logger.addHandler(handler)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def test_json_lines_carry_the_bound_job_fields_and_the_trace_id(recorded: InMemorySpanExporter) -> None:
    out = io.StringIO()
    log = _log_through("json", out)
    trace_id, incoming = _traceparent()
    job_id = uuid.uuid4()
    with tracing.span("attempt", incoming), logs.bound(job_id=job_id, attempt=2, fence=3, tenant_id=None):
        log.info("job %s: done", "x")
    log.info("outside")
    inside, outside = (json.loads(line) for line in out.getvalue().splitlines())
    assert inside["message"] == "job x: done" and inside["level"] == "INFO"
    assert (inside["job_id"], inside["attempt"], inside["fence"]) == (str(job_id), "2", "3")
    assert inside["trace_id"] == trace_id and "tenant_id" not in inside
    assert not set(logs.FIELDS) & set(outside)


def test_text_lines_stay_readable_with_the_fields_at_the_end() -> None:
    out = io.StringIO()
    log = _log_through("text", out)
    with logs.bound(delivery_id="d-1", attempt=1):
        log.warning("retrying")
    line = out.getvalue().strip()
    assert " WARNING " in line and line.endswith("retrying [attempt=1 delivery_id=d-1]")


def test_auto_is_text_on_a_terminal_and_json_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert isinstance(logs.formatter_for("auto", Tty()), logs.TextFormatter)
    assert isinstance(logs.formatter_for("auto", io.StringIO()), logs.JsonFormatter)
    assert CommonSettings.from_env({"FATURA_LOG_FORMAT": "JSON"}).log_format == "json"
    with pytest.raises(SettingsError, match="FATURA_LOG_FORMAT"):
        CommonSettings.from_env({"FATURA_LOG_FORMAT": "xml"})


def test_the_standard_otel_variables_send_spans_to_an_otlp_collector() -> None:
    # Given a collector that keeps what is POSTed to it
    posts: list[tuple[str, bytes]] = []

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            posts.append((self.path, self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        # When a process set up by OTEL_TRACES_EXPORTER=otlp records a span and exits
        script = (
            "from services.common import tracing\n"
            "assert tracing.setup('probe')\n"
            "with tracing.span('probe span'):\n"
            "    pass\n"
            "tracing.shutdown()\n"
        )
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{server.server_port}",
            "PATH": "/usr/bin:/bin",
        }
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
    # Then the collector received it at the OTLP/HTTP traces path
    assert [path for path, _ in posts] == ["/v1/traces"]
    assert b"probe span" in posts[0][1] and b"fatura-probe" in posts[0][1]
