"""Helpers for the job event feed's tests: jobs whose states change through the unit of work (as every
writer records them), and a blocking reader of an SSE stream."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

from fix_db import SyncPool
from services.common.uow import JobChange, unit_of_work

NEW_JOB = """
WITH doc AS (
    INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text)
    VALUES (%(tenant_id)s, %(job_id)s, 1, 'x', 4, 'text')
)
INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id, document_version,
    object_version, doc_bytes, estimated_tokens, schema_version, policy_version, model_policy, priority,
    state, deadline_at)
VALUES (%(job_id)s, %(tenant_id)s, %(job_id)s::text, 'h', %(job_id)s, 1, 'x', 4, 100, 'invoice.v1', 'p1',
    'default', 'batch', 'READY', now() + interval '1 hour')
"""
CHANGE = """
UPDATE extraction_jobs SET state = %(state)s, state_version = state_version + 1, updated_at = now()
WHERE id = %(job_id)s RETURNING state_version
"""


def new_job(pool: SyncPool, tenant_id: uuid.UUID) -> uuid.UUID:
    """A READY job with its first event, written in one transaction."""
    job_id = uuid.uuid4()
    with unit_of_work(pool) as uow:
        uow.execute(NEW_JOB, {"tenant_id": tenant_id, "job_id": job_id})
        uow.record(JobChange(tenant_id, job_id, "READY", 1, None))
    return job_id


def change_state(pool: SyncPool, tenant_id: uuid.UUID, job_id: uuid.UUID, state: str) -> int:
    """Move the job to ``state`` and record its event; returns the new state version."""
    with unit_of_work(pool) as uow:
        row = uow.execute(CHANGE, {"state": state, "job_id": job_id}).fetchone()
        assert row is not None
        uow.record(JobChange(tenant_id, job_id, state, row["state_version"], None))
    return int(row["state_version"])


def job_seqs(pool: SyncPool, job_id: uuid.UUID) -> list[int]:
    with pool.connection() as conn:
        rows = conn.execute("SELECT seq FROM job_events WHERE job_id = %s ORDER BY seq", (job_id,)).fetchall()
    return [int(r["seq"]) for r in rows]


@dataclass
class SseEvent:
    event: str  # 'message' when the frame names none
    id: str | None
    data: dict[str, Any]


@dataclass
class SseStream:
    """Frames of one open stream, parsed as an EventSource would; comments are counted."""

    response: httpx.Response
    lines: Iterator[str]
    comments: int = 0
    last_id: str | None = None
    ended: bool = False
    _buffer: list[SseEvent] = field(default_factory=list)

    def next(self, timeout: float = 10.0) -> SseEvent:
        """The next event (not a comment) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        event, data, frame_id = "message", [], None
        for line in self.lines:
            if line == "":
                if data:
                    if frame_id is not None:
                        self.last_id = frame_id
                    return SseEvent(event, frame_id, json.loads("\n".join(data)))
                event, data, frame_id = "message", [], None
            elif line.startswith(":"):
                self.comments += 1
            else:
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "data":
                    data.append(value)
                elif name == "event":
                    event = value
                elif name == "id":
                    frame_id = value
            if time.monotonic() > deadline:
                raise TimeoutError(f"no event within {timeout}s")
        self.ended = True
        raise EOFError("the server ended the stream")

    def take(self, count: int, timeout: float = 10.0) -> list[SseEvent]:
        deadline = time.monotonic() + timeout
        return [self.next(max(0.1, deadline - time.monotonic())) for _ in range(count)]

    def until(self, predicate: Any, timeout: float = 10.0) -> list[SseEvent]:
        """Events up to and including the first that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen: list[SseEvent] = []
        while True:
            seen.append(self.next(max(0.1, deadline - time.monotonic())))
            if predicate(seen[-1]):
                return seen


@contextmanager
def sse(base_url: str, path: str, key: str, last_event_id: str | None = None) -> Iterator[SseStream]:
    """Open ``path`` as an event stream; the status and headers are checked by the caller."""
    headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    with (
        httpx.Client(base_url=base_url, timeout=httpx.Timeout(10.0, read=5.0)) as client,
        client.stream("GET", path, headers=headers) as response,
    ):
        yield SseStream(response, response.iter_lines())
