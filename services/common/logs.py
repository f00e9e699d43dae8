"""Logging for every process: JSON lines for machines, readable lines on a terminal (issue 13).

``setup`` is called once by each entry point. ``FATURA_LOG_FORMAT`` is ``json``, ``text`` or
``auto`` (text when stderr is a terminal, JSON lines otherwise). Every record carries the fields
bound where the job or delivery is known (``job_id``, ``tenant_id``, ``attempt``, ``fence``,
``delivery_id``) through :func:`bound`, and the ``trace_id`` of the current span.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TextIO

from opentelemetry import trace

FIELDS = ("trace_id", "job_id", "tenant_id", "attempt", "fence", "delivery_id")
_bound: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "fatura_log_fields", default=None
)


@contextmanager
def bound(**fields: object) -> Iterator[None]:
    """Inside the block, every log record of this thread or task carries ``fields`` too."""
    merged = {**(_bound.get() or {}), **{k: str(v) for k, v in fields.items() if v is not None}}
    token = _bound.set(merged)
    try:
        yield
    finally:
        _bound.reset(token)


def context_fields() -> dict[str, str]:
    fields = dict(_bound.get() or {})
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        fields["trace_id"] = format(ctx.trace_id, "032x")
    return fields


class _WithContext(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.fatura = context_fields()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            **getattr(record, "fatura", {}),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """The classic line, with the context fields appended as ``key=value``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = getattr(record, "fatura", {})
        if not fields:
            return text
        head, sep, tail = text.partition("\n")
        extra = " ".join(f"{k}={fields[k]}" for k in FIELDS if k in fields)
        return f"{head} [{extra}]{sep}{tail}"


def formatter_for(log_format: str, stream: TextIO) -> logging.Formatter:
    if log_format == "json" or (log_format == "auto" and not _is_tty(stream)):
        return JsonFormatter()
    return TextFormatter()


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def setup(level: str = "INFO", log_format: str = "auto", stream: TextIO | None = None) -> None:
    """Route every logger to stderr in the chosen format, replacing any earlier configuration."""
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter_for(log_format, stream))
    handler.addFilter(_WithContext())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    for noisy in ("pika", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
