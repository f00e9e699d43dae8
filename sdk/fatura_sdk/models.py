"""What the API answers, as typed values. Each keeps the whole JSON body in ``raw``, so a field the
server adds later is never lost to a client that does not know it yet.

A job is ``done`` only in a final state (SUCCEEDED, FAILED_TERMINAL, CANCELLED, REJECTED). A job in
REVIEW_REQUIRED is not done: the machine has finished, a human reviewer decides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from fatura_sdk.errors import UnexpectedAnswer

JSON = dict[str, Any]

READY = "READY"
RUNNING = "RUNNING"
RETRY_SCHEDULED = "RETRY_SCHEDULED"
SUCCEEDED = "SUCCEEDED"
REVIEW_REQUIRED = "REVIEW_REQUIRED"
FAILED_TERMINAL = "FAILED_TERMINAL"
CANCELLED = "CANCELLED"
REJECTED = "REJECTED"
FINAL_STATES = frozenset({SUCCEEDED, FAILED_TERMINAL, CANCELLED, REJECTED})
UNFINISHED_STATES = (READY, RUNNING, RETRY_SCHEDULED, REVIEW_REQUIRED)


def _require(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(name)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise UnexpectedAnswer(f"the answer has no valid `{name}`: {str(dict(body))[:200]}")
    return value


def _optional_int(body: Mapping[str, Any], name: str) -> int | None:
    value = body.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _optional_dict(body: Mapping[str, Any], name: str) -> JSON | None:
    value = body.get(name)
    return value if isinstance(value, dict) else None


def _object(body: Any) -> JSON:
    if not isinstance(body, dict):
        raise UnexpectedAnswer(f"the answer is not a JSON object: {str(body)[:200]}")
    return body


@dataclass(frozen=True)
class StoredDocument:
    """A stored, immutable document version (``POST /v1/documents``); submit it by reference."""

    document_id: str
    version: int
    sha256: str
    size: int
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any) -> StoredDocument:
        body = _object(body)
        return cls(
            document_id=_require(body, "document_id", str),
            version=_require(body, "version", int),
            sha256=str(body.get("sha256", "")),
            size=_optional_int(body, "size") or 0,
            raw=body,
        )


@dataclass(frozen=True)
class Accepted:
    """The 202 of a submission: the job has STARTED and is not complete (unless ``replayed`` names a
    job that finished earlier). It never carries a result."""

    job_id: str
    state: str
    done: bool
    state_version: int | None
    status_url: str
    poll_after_seconds: int | None
    estimated_duration_seconds: int | None
    message: str
    idempotency_key: str
    replayed: bool = False
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any, *, idempotency_key: str, replayed: bool) -> Accepted:
        body = _object(body)
        return cls(
            job_id=_require(body, "job_id", str),
            state=_require(body, "state", str),
            done=_require(body, "done", bool),
            state_version=_optional_int(body, "state_version"),
            status_url=str(body.get("status_url", "")),
            poll_after_seconds=_optional_int(body, "poll_after_seconds"),
            estimated_duration_seconds=_optional_int(body, "estimated_duration_seconds"),
            message=str(body.get("message", "")),
            idempotency_key=idempotency_key,
            replayed=replayed,
            raw=body,
        )


@dataclass(frozen=True)
class JobStatus:
    """``GET /v1/extraction-jobs/{id}``: the authoritative state of one job."""

    job_id: str
    state: str
    done: bool
    state_version: int
    attempts: int
    message: str
    poll_after_seconds: int | None = None
    status_url: str = ""
    result: JSON | None = None
    review: JSON | None = None
    error: JSON | None = None
    last_error: JSON | None = None
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any) -> JobStatus:
        body = _object(body)
        return cls(
            job_id=_require(body, "job_id", str),
            state=_require(body, "state", str),
            done=_require(body, "done", bool),
            state_version=_require(body, "state_version", int),
            attempts=_optional_int(body, "attempts") or 0,
            message=str(body.get("message", "")),
            poll_after_seconds=_optional_int(body, "poll_after_seconds"),
            status_url=str(body.get("status_url", "")),
            result=_optional_dict(body, "result"),
            review=_optional_dict(body, "review"),
            error=_optional_dict(body, "error"),
            last_error=_optional_dict(body, "last_error"),
            raw=body,
        )

    @property
    def succeeded(self) -> bool:
        """True only for a finished job whose result passed validation or a reviewer's approval."""
        return self.done and self.state == SUCCEEDED


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    state: str
    done: bool
    state_version: int
    status_url: str
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any) -> JobSummary:
        body = _object(body)
        return cls(
            job_id=_require(body, "job_id", str),
            state=_require(body, "state", str),
            done=_require(body, "done", bool),
            state_version=_optional_int(body, "state_version") or 0,
            status_url=str(body.get("status_url", "")),
            raw=body,
        )


@dataclass(frozen=True)
class JobPage:
    jobs: list[JobSummary]
    next_cursor: str | None

    @classmethod
    def from_json(cls, body: Any) -> JobPage:
        body = _object(body)
        jobs = _require(body, "jobs", list)
        cursor = body.get("next_cursor")
        return cls([JobSummary.from_json(j) for j in jobs], cursor if isinstance(cursor, str) else None)


@dataclass(frozen=True)
class Batch:
    """A batch's 202 or its status: ``counts`` (total, processed, pending, succeeded,
    review_required, failed, rejected, cancelled), ``state`` (accepting, running, completed,
    completed_with_errors) and ``done``, true only when every item is final."""

    batch_id: str
    state: str
    done: bool
    counts: dict[str, int]
    message: str
    status_url: str
    items_url: str
    poll_after_seconds: int | None = None
    errors_url: str | None = None
    idempotency_key: str | None = None
    replayed: bool = False
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any, *, idempotency_key: str | None = None, replayed: bool = False) -> Batch:
        body = _object(body)
        counts = _require(body, "counts", dict)
        errors_url = body.get("errors_url")
        return cls(
            batch_id=_require(body, "batch_id", str),
            state=_require(body, "state", str),
            done=_require(body, "done", bool),
            counts={k: v for k, v in counts.items() if isinstance(v, int)},
            message=str(body.get("message", "")),
            status_url=str(body.get("status_url", "")),
            items_url=str(body.get("items_url", "")),
            poll_after_seconds=_optional_int(body, "poll_after_seconds"),
            errors_url=errors_url if isinstance(errors_url, str) else None,
            idempotency_key=idempotency_key,
            replayed=replayed,
            raw=body,
        )


@dataclass(frozen=True)
class BatchItem:
    """One item of a batch: its job's state; ``result`` only once it SUCCEEDED."""

    index: int
    job_id: str
    idempotency_key: str
    state: str
    done: bool
    state_version: int
    result: JSON | None = None
    review: JSON | None = None
    error: JSON | None = None
    raw: JSON = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, body: Any) -> BatchItem:
        body = _object(body)
        return cls(
            index=_require(body, "index", int),
            job_id=_require(body, "job_id", str),
            idempotency_key=str(body.get("idempotency_key", "")),
            state=_require(body, "state", str),
            done=_require(body, "done", bool),
            state_version=_optional_int(body, "state_version") or 0,
            result=_optional_dict(body, "result"),
            review=_optional_dict(body, "review"),
            error=_optional_dict(body, "error"),
            raw=body,
        )


@dataclass(frozen=True)
class BatchItemsPage:
    batch_id: str
    items: list[BatchItem]
    next_cursor: str | None

    @classmethod
    def from_json(cls, body: Any) -> BatchItemsPage:
        body = _object(body)
        items = _require(body, "items", list)
        cursor = body.get("next_cursor")
        return cls(
            str(body.get("batch_id", "")),
            [BatchItem.from_json(i) for i in items],
            cursor if isinstance(cursor, str) else None,
        )
