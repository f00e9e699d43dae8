"""The webhook body (DESIGN §5.9), serialized once: these bytes are stored, signed and sent.

A batch's event (``batch.completed.v1``) describes the batch instead of a job: its final state and
counts, and where to read its items; it is sent once, when every item is final.

Rule for versions: a body describes the event's own state and state_version (each event is one
effect; receivers apply only newer versions). The result, review reasons and error come from the
job row when the row is still at the event's version, which is always the case for the terminal
events delivered here, since a terminal job never changes again; if the row has moved on they are
left out and the receiver reads the authoritative state at ``status_url``.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

from services.common import events
from services.common.job_errors import tenant_error

PING = "webhook.ping.v1"
# What an endpoint receives when it names no event types: an ERP's events. A result that did not
# pass validation is never among them (DESIGN §5.13).
EVENT_TYPES = (
    events.EXTRACTION_COMPLETED,
    events.EXTRACTION_FAILED,
    events.EXTRACTION_REJECTED,
    events.BATCH_COMPLETED,
)
# What an endpoint may subscribe to; the review request only by naming it (a review tool).
SUBSCRIBABLE = (*EVENT_TYPES, events.REVIEW_REQUESTED)
# What an ERP acknowledges (POST /v1/deliveries/{id}:ack): only a delivered result is something to
# post to its books; a ping, a failure notice or a review request has no business outcome.
ACKNOWLEDGEABLE = (events.EXTRACTION_COMPLETED,)


def _iso(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def dumps(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False, sort_keys=False).encode("utf-8")


def status_url(job_id: uuid.UUID) -> str:
    return f"/v1/extraction-jobs/{job_id}"


def review_url(review_id: uuid.UUID) -> str:
    return f"/review#{review_id}"


def event_body(
    *,
    event_id: uuid.UUID,
    event_type: str,
    tenant_id: uuid.UUID,
    job_id: uuid.UUID,
    state: str,
    state_version: int,
    occurred_at: datetime,
    job: dict[str, Any],
    review_id: uuid.UUID | None = None,
) -> bytes:
    """The body of one event's deliveries; ``job`` is the job row as JSON (``to_jsonb``).

    A review request carries ids, reason codes and the review's URL, never the extracted fields
    nor the reasons' messages (which quote them): the result it is about has not passed validation.
    """
    data: dict[str, Any] = {
        "job_id": str(job_id),
        "tenant_id": str(tenant_id),
        "state": state,
        "state_version": state_version,
    }
    current = job.get("state_version") == state_version
    if event_type == events.REVIEW_REQUESTED:
        review: dict[str, Any] = {
            "reasons": [
                {"code": r.get("code"), "field": r.get("field")}
                for r in (job.get("review_reasons") or [])
                if isinstance(r, dict)
            ]
        }
        if review_id is not None:
            review["review_id"] = str(review_id)
            review["review_url"] = review_url(review_id)
        data["review"] = review
    elif current:
        if job.get("result") is not None and event_type == events.EXTRACTION_COMPLETED:
            data["result"] = job["result"]
            data["decided_by"] = job.get("decided_by") or "model"
            if job.get("correction"):
                data["correction"] = {"changes": job["correction"].get("changes")}
        if job.get("error_class") is not None:
            data["error"] = tenant_error(job["error_class"], job.get("error_message"), state)
    if job.get("policy_version") is not None:
        data["policy_version"] = job["policy_version"]
    data["status_url"] = status_url(job_id)
    data["occurred_at"] = _iso(occurred_at)
    return dumps({"type": event_type, "id": str(event_id), "timestamp": _iso(occurred_at), "data": data})


def batch_body(
    *, event_id: uuid.UUID, event_type: str, state: str, occurred_at: datetime, batch: dict[str, Any]
) -> bytes:
    """The body of a batch event's deliveries: ids, the batch's final state and counts, never a
    result (each item's own event carries it); ``batch`` is the batch row with its summed counters."""
    counts = {name: int(batch[name]) for name in ("succeeded", "failed", "rejected", "cancelled")}
    url = f"/v1/extraction-batches/{batch['id']}"
    data: dict[str, Any] = {
        "batch_id": str(batch["id"]),
        "tenant_id": str(batch["tenant_id"]),
        "state": state,
        "state_version": 1,
        "counts": {"total": int(batch["total"]), "processed": sum(counts.values()), **counts},
        "status_url": url,
        "items_url": f"{url}/items",
    }
    if counts["succeeded"] < int(batch["total"]):
        data["errors_url"] = f"{url}/items?state=errors"
    data["occurred_at"] = _iso(occurred_at)
    return dumps({"type": event_type, "id": str(event_id), "timestamp": _iso(occurred_at), "data": data})


def ping_body(ping_id: uuid.UUID, endpoint_id: uuid.UUID, at: datetime) -> bytes:
    return dumps(
        {"type": PING, "id": str(ping_id), "timestamp": _iso(at), "data": {"endpoint_id": str(endpoint_id)}}
    )
