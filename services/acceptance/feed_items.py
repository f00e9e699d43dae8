"""What an event stream carries: job events, snapshots and the end, each with the JSON a client reads.

A job event's body is encoded once, when the feed reads it, and shared by every stream it goes to.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import DictRow

from services.acceptance.views import status_url
from services.common import states


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of the job event log, as every stream sends it."""

    seq: int
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    state_version: int
    kind: str  # 'state' | 'review' | 'erp_ack'
    at: datetime
    data: bytes = field(repr=False, compare=False)  # the JSON body, encoded once for every stream
    sse: bytes = field(repr=False, compare=False)  # the same as a server-sent event frame

    @classmethod
    def from_row(cls, row: DictRow) -> JobEvent:
        body = {
            "seq": row["seq"],
            "job_id": str(row["job_id"]),
            "state": row["state"],
            "state_version": row["state_version"],
            "kind": row["kind"],
            "at": row["at"].isoformat(),
            "done": states.is_done(row["state"]),
            "status_url": status_url(row["job_id"]),
        }
        data = json.dumps(body, separators=(",", ":")).encode()
        return cls(
            seq=row["seq"],
            tenant_id=row["tenant_id"],
            job_id=row["job_id"],
            state=row["state"],
            state_version=row["state_version"],
            kind=row["kind"],
            at=row["at"],
            data=data,
            sse=b"id: %d\ndata: %s\n\n" % (row["seq"], data),
        )


@dataclass(frozen=True)
class SnapshotJob:
    job_id: uuid.UUID
    state: str
    state_version: int

    def body(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id),
            "state": self.state,
            "state_version": self.state_version,
            "done": states.is_done(self.state),
            "status_url": status_url(self.job_id),
        }


@dataclass(frozen=True)
class Snapshot:
    """The stream's jobs as they are now, sent first when there is no cursor to resume from
    (``reason`` ``no_cursor``) or when the events after it were pruned (``cursor_expired``).
    ``seq`` is where the stream goes on from: a client resuming from it gets no second snapshot."""

    seq: int
    reason: str
    jobs: tuple[SnapshotJob, ...]
    truncated: bool
    job_stream: bool

    def body(self) -> dict[str, Any]:
        if self.job_stream:
            message = "The job as it is now; its later events follow."
        else:
            message = "Your unfinished jobs as they are now; later events follow."
            if self.reason == "cursor_expired":
                message += (
                    " Events before this point were deleted after their retention: a job that finished"
                    " meanwhile is not listed; GET /v1/extraction-jobs lists every job."
                )
            if self.truncated:
                message += f" Only the newest {len(self.jobs)} are listed; GET /v1/extraction-jobs lists all."
        return {
            "type": "snapshot",
            "reason": self.reason,
            "seq": self.seq,
            "jobs": [job.body() for job in self.jobs],
            "truncated": self.truncated,
            "message": message,
        }


@dataclass(frozen=True)
class End:
    """The server ended the stream; always the last item."""

    reason: str  # 'key_revoked' | 'shutdown'
    message: str

    def body(self) -> dict[str, Any]:
        return {"type": "end", "reason": self.reason, "message": self.message}


FeedItem = JobEvent | Snapshot | End
