"""Server-sent events: a decoder of the ``text/event-stream`` format (WHATWG HTML §9.2) and the
bookkeeping of automatic resumption, shared by both clients.

The ``id:`` of an event is its sequence; after a disconnect the client reconnects with
``Last-Event-ID`` set to the last event it handed out, and the server replays what was missed.
Comment lines (``: heartbeat``) keep the connection alive and are not events. A job event has no
``event:`` line and its data is ``{seq, job_id, state, state_version, kind, at, done, status_url}``;
a ``snapshot`` comes first when there is no cursor; an ``end`` event closes the stream.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

EVENT_STREAM = "text/event-stream"
# The job's (or the tenant's unfinished jobs') state first, when there is no cursor to resume from.
SNAPSHOT = "snapshot"
# The server ends the stream (shutting down, the key revoked): reconnecting says whether to go on.
END = "end"


@dataclass(frozen=True)
class ServerEvent:
    """One event: its ``id`` (the sequence to resume from), its ``event`` type and its ``data``."""

    id: str | None
    event: str
    data: str
    json: Any = field(default=None, repr=False, compare=False)

    def _field(self, name: str) -> Any:
        return self.json.get(name) if isinstance(self.json, dict) else None

    @property
    def job_id(self) -> str | None:
        value = self._field("job_id")
        return value if isinstance(value, str) else None

    @property
    def state(self) -> str | None:
        value = self._field("state")
        return value if isinstance(value, str) else None

    @property
    def state_version(self) -> int | None:
        value = self._field("state_version")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def done(self) -> bool:
        """The event says its job is done (a snapshot: every job it lists is)."""
        if self.event == SNAPSHOT:
            jobs = self._field("jobs")
            return bool(jobs) and all(isinstance(j, dict) and j.get("done") is True for j in jobs)
        return self._field("done") is True


def _parse(data: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return None


class SseDecoder:
    """Feed it the stream's lines (without their line endings); it returns each complete event."""

    def __init__(self) -> None:
        self.last_event_id: str | None = None
        self.retry_ms: int | None = None
        self.comments = 0
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> ServerEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self.last_event_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.retry_ms = int(value)
        return None

    def _dispatch(self) -> ServerEvent | None:
        data, event = "\n".join(self._data), self._event or "message"
        self._data, self._event = [], ""
        if not data and event == "message":
            return None
        return ServerEvent(self.last_event_id or None, event, data, _parse(data))


@dataclass
class Resumption:
    """Where a stream resumes from and how long to wait before reconnecting.

    ``max_reconnects`` consecutive reconnects without an event in between (None: no limit) before
    the last error is raised.
    """

    last_event_id: str | None = None
    max_reconnects: int | None = None
    base_delay: float = 1.0
    max_delay: float = 30.0
    failures: int = 0
    server_retry_ms: int | None = None
    rng: random.Random = field(default_factory=random.Random)

    def headers(self) -> dict[str, str]:
        headers = {"Accept": EVENT_STREAM, "Cache-Control": "no-cache"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def delivered(self, event: ServerEvent) -> None:
        if event.id is not None:
            self.last_event_id = event.id
        self.failures = 0

    def connected(self, decoder: SseDecoder) -> None:
        self.server_retry_ms = decoder.retry_ms if decoder.retry_ms is not None else self.server_retry_ms

    def next_delay(self) -> float | None:
        """Seconds before the next reconnect; None when reconnecting should stop."""
        self.failures += 1
        if self.max_reconnects is not None and self.failures > self.max_reconnects:
            return None
        base = self.server_retry_ms / 1000 if self.server_retry_ms is not None else self.base_delay
        delay = min(self.max_delay, base * 2 ** (self.failures - 1))
        return float(delay / 2 + self.rng.uniform(0.0, delay / 2))
