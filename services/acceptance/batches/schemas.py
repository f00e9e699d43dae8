"""JSON Schemas of the batch routes: the request the server validates and the bodies it answers, the
same dictionaries ``/openapi.json`` publishes. An item is the body of ``POST /v1/extraction-jobs``
(its document inline or by id, its options) with an optional key of its own."""

from __future__ import annotations

from typing import Any

from services.acceptance import schemas as job_schemas
from services.common import states

JSON = dict[str, Any]

BATCH_STATES = ("accepting", "running", "completed", "completed_with_errors")
COUNTS = ("total", "processed", "pending", "succeeded", "review_required", "failed", "rejected", "cancelled")
MAX_ITEMS_LIMIT = 200

_UUID: JSON = {"type": "string", "pattern": job_schemas.UUID_PATTERN}
_KEY: JSON = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x21-\\x7e]+$"}


def create_batch_request(model_policies: tuple[str, ...], max_items: int) -> JSON:
    job = job_schemas.create_job_request(model_policies)
    item: JSON = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            **{name: job["properties"][name] for name in ("document_id", "document_version", "document")},
            "options": {
                **job["properties"]["options"],
                "description": "This item's options, instead of the batch's.",
            },
            "idempotency_key": {
                **_KEY,
                "description": (
                    "This item's own key. Without it the item's key is the batch's key, a space, `#` "
                    "and the item's index (`invoice-run-7 #0`), which no key a client sends can equal."
                ),
            },
        },
        "oneOf": job["oneOf"],
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["items"],
        "properties": {
            "items": {"type": "array", "minItems": 1, "maxItems": max_items, "items": item},
            **{name: job["properties"][name] for name in ("schema", "priority", "deadline_seconds")},
            "options": {
                **job["properties"]["options"],
                "description": "Every item's options, unless it has its own.",
            },
        },
    }


_COUNTS: JSON = {
    "type": "object",
    "description": (
        "processed = succeeded + failed + rejected + cancelled (items that are final); review_required "
        "items wait for a human and are not processed yet; pending items are queued or running."
    ),
    "required": list(COUNTS),
    "properties": {name: {"type": "integer", "minimum": 0} for name in COUNTS},
}

BATCH_ACCEPTED: JSON = {
    "type": "object",
    "required": [
        "batch_id",
        "state",
        "done",
        "counts",
        "status_url",
        "items_url",
        "poll_after_seconds",
        "estimated_duration_seconds",
        "message",
    ],
    "properties": {
        "batch_id": _UUID,
        "state": {"type": "string", "enum": list(BATCH_STATES)},
        "done": {"type": "boolean"},
        "counts": _COUNTS,
        "status_url": {"type": "string"},
        "items_url": {"type": "string"},
        "poll_after_seconds": {"type": "integer", "minimum": 1},
        "estimated_duration_seconds": {"type": "integer", "minimum": 0},
        "message": {"type": "string"},
    },
}

BATCH_STATUS: JSON = {
    "type": "object",
    "required": [
        "batch_id",
        "state",
        "done",
        "counts",
        "created_at",
        "completed_at",
        "elapsed_seconds",
        "status_url",
        "items_url",
        "message",
    ],
    "properties": {
        "batch_id": _UUID,
        "state": {"type": "string", "enum": list(BATCH_STATES)},
        "done": {"type": "boolean"},
        "counts": _COUNTS,
        "priority": {"type": "string", "enum": list(job_schemas.PRIORITIES)},
        "created_at": {"type": "string", "format": "date-time"},
        "completed_at": {"type": ["string", "null"], "format": "date-time"},
        "elapsed_seconds": {"type": "number", "minimum": 0},
        "poll_after_seconds": {"type": "integer", "minimum": 1},
        "status_url": {"type": "string"},
        "items_url": {"type": "string"},
        "errors_url": {"type": "string", "description": "the items that ended without a result"},
        "message": {"type": "string"},
    },
}

BATCH_ITEM: JSON = {
    "type": "object",
    "required": ["index", "job_id", "idempotency_key", "state", "done", "state_version", "status_url"],
    "properties": {
        "index": {"type": "integer", "minimum": 0},
        "job_id": _UUID,
        "idempotency_key": {"type": "string"},
        "state": {"type": "string", "enum": sorted(states.ALL)},
        "done": {"type": "boolean"},
        "state_version": {"type": "integer", "minimum": 1},
        "status_url": {"type": "string"},
        "result": {"type": ["object", "null"], "description": "the invoice.v1 extraction (SUCCEEDED only)"},
        "decided_by": {"type": "string", "enum": ["model", "reviewer"]},
        "review": {
            "type": "object",
            "required": ["reasons"],
            "properties": {"reasons": {"type": "array"}},
        },
        "error": job_schemas.JOB_ERROR,
    },
}

BATCH_ITEMS: JSON = {
    "type": "object",
    "required": ["batch_id", "items", "next_cursor"],
    "properties": {
        "batch_id": _UUID,
        "items": {"type": "array", "items": {"$ref": "#/components/schemas/BatchItem"}},
        "next_cursor": {"type": ["string", "null"]},
    },
}
