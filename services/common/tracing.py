"""Traces: one per job, across every process, carried as a W3C ``traceparent`` (issue 13).

The request that accepts a job starts (or continues) the trace; its ``traceparent`` is written
on the job row and in the outbox event, so the relay, the inference worker (claim, limiter call,
each provider hop, validation) and the delivery worker (each webhook attempt, whose POST carries
``traceparent`` to the receiver) start their spans as children of it, however many processes
and restarts lie between them.

Off by default. ``OTEL_TRACES_EXPORTER`` (``otlp``, ``console``, or ``none``, the default) picks
the exporter, and the OTLP exporter reads the rest of the standard ``OTEL_EXPORTER_OTLP_*``
variables itself; ``OTEL_SERVICE_NAME`` overrides the process's name. ``FATURA_TRACE_FILE`` also
appends every finished span to a file as one JSON line (tests, local debugging). With nothing
configured the OpenTelemetry API's no-op tracer runs: a span costs a context switch, nothing is
recorded, and an incoming ``traceparent`` is still passed on unchanged.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import Span, SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from services.common.settings import SettingsError

__all__ = [
    "TRACEPARENT",
    "Span",
    "SpanKind",
    "current_traceparent",
    "enabled",
    "record_span",
    "setup",
    "shutdown",
    "span",
    "valid",
]

TRACEPARENT = "traceparent"
# version 00: 2 + 32 + 16 + 2 hex digits; anything else is ignored, never refused (W3C §3.3).
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACER = trace.get_tracer("fatura")
Attributes = Mapping[str, str | int | float | bool]

_enabled = False


def enabled() -> bool:
    """True once ``setup`` installed an exporter: spans are recorded and exported."""
    return _enabled


def setup(service_name: str, *, trace_file: str | None = None, env: Mapping[str, str] | None = None) -> bool:
    """Install the tracer provider this process's settings ask for; False (and the no-op tracer)
    when they ask for none. Call once, at the process's start."""
    global _enabled
    if _enabled:
        return True
    env = os.environ if env is None else env
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "none").split(",") if n.strip()]
    unknown = set(names) - {"none", "otlp", "console"}
    if unknown:
        raise SettingsError(f"OTEL_TRACES_EXPORTER={sorted(unknown)}: this build exports to otlp or console")
    processors: list[Any] = []
    if "otlp" in names:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        processors.append(BatchSpanProcessor(OTLPSpanExporter()))
    if "console" in names:
        processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
    if trace_file:
        processors.append(SimpleSpanProcessor(JsonLinesExporter(trace_file)))
    if not processors:
        return False
    resource = Resource.create({"service.name": env.get("OTEL_SERVICE_NAME") or f"fatura-{service_name}"})
    provider = TracerProvider(resource=resource)
    for processor in processors:
        provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    _enabled = True
    return True


def shutdown() -> None:
    """Flush what is buffered (the provider also does this at interpreter exit)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def valid(traceparent: object) -> str | None:
    """The value if it is a well-formed version-00 ``traceparent``, else None."""
    if isinstance(traceparent, str) and _TRACEPARENT.match(traceparent):
        return traceparent
    return None


def current_traceparent() -> str | None:
    """The ``traceparent`` naming the current span, for a row, a message or a request header."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return None
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def parent_context(traceparent: str | None) -> otel_context.Context | None:
    if traceparent is None or valid(traceparent) is None:
        return None
    return _PROPAGATOR.extract({TRACEPARENT: traceparent})


@contextmanager
def span(
    name: str,
    traceparent: str | None = None,
    attributes: Attributes | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Span]:
    """A span, current inside the block: a child of ``traceparent`` when one is given (another
    process's span), else of the current span."""
    if not _enabled:
        # What the no-op tracer would make current (the parent's context, recording nothing), set
        # directly: a tenth of the no-op tracer's cost, paid several times per job.
        parent = _untraced_parent(traceparent)
        if parent is None:
            yield trace.get_current_span()
            return
        token = otel_context.attach(trace.set_span_in_context(parent))
        try:
            yield parent
        finally:
            otel_context.detach(token)
        return
    with _TRACER.start_as_current_span(
        name, context=parent_context(traceparent), kind=kind, attributes=attributes
    ) as current:
        yield current


def _untraced_parent(traceparent: str | None) -> Span | None:
    """The span the no-op tracer makes current for a child of ``traceparent``: the remote parent
    itself, the invalid span for one the W3C propagator refuses (version ff, an all-zero id), or
    None for no well-formed traceparent (the current span stays current)."""
    if traceparent is None or valid(traceparent) is None:
        return None
    trace_id, span_id = int(traceparent[3:35], 16), int(traceparent[36:52], 16)
    if traceparent[:2] == "ff" or not trace_id or not span_id:
        return trace.INVALID_SPAN
    flags = trace.TraceFlags(int(traceparent[53:55], 16))
    return trace.NonRecordingSpan(trace.SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags))


@contextmanager
def side_by_side(
    spans: Iterable[tuple[str, str | None, Attributes]], *, kind: SpanKind = SpanKind.INTERNAL
) -> Iterator[list[Span]]:
    """Spans of one step done for several traces at once (the relay's publishes of one batch): for
    each (name, traceparent, attributes), a child of that traceparent (else of the current span);
    none is made current, so none nests in another, and all end with the block. With tracing off
    there is nothing to record: no span, and ``spans`` is not read."""
    if not _enabled:
        yield []
        return
    started = [
        _TRACER.start_span(name, context=parent_context(traceparent), kind=kind, attributes=attributes)
        for name, traceparent, attributes in spans
    ]
    try:
        yield started
    except BaseException as exc:
        for s in started:
            s.record_exception(exc)
            s.set_status(trace.StatusCode.ERROR)
        raise
    finally:
        for s in started:
            s.end()


def record_span(
    name: str,
    start: datetime,
    end: datetime,
    attributes: Attributes,
    *,
    error: bool = False,
    kind: SpanKind = SpanKind.CLIENT,
) -> None:
    """A finished span, child of the current one, for a step timed elsewhere (a provider hop)."""
    if not _enabled:
        return
    s = _TRACER.start_span(name, kind=kind, attributes=attributes, start_time=_ns(start))
    if error:
        s.set_status(trace.StatusCode.ERROR)
    s.end(end_time=_ns(end))


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


class JsonLinesExporter(SpanExporter):
    """Appends each finished span to a file as one JSON line; processes may share the file (each
    line is written with one ``write`` on a file opened for appending)."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(_as_dict(s), default=str) + "\n" for s in spans)
        with self._lock, open(self._path, "a", encoding="utf-8") as out:
            out.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _as_dict(s: ReadableSpan) -> dict[str, Any]:
    ctx = s.get_span_context()
    assert ctx is not None
    return {
        "name": s.name,
        "trace_id": format(ctx.trace_id, "032x"),
        "span_id": format(ctx.span_id, "016x"),
        "parent_span_id": format(s.parent.span_id, "016x") if s.parent is not None else None,
        "service": s.resource.attributes.get("service.name"),
        "pid": os.getpid(),
        "kind": s.kind.name,
        "start_ns": s.start_time,
        "end_ns": s.end_time,
        "status": s.status.status_code.name,
        "attributes": dict(s.attributes or {}),
    }
