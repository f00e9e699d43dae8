"""JSON Schemas of the HTTP API. The same dictionaries validate requests and form ``/openapi.json``,
so the published contract is the one the server enforces.
"""

from __future__ import annotations

from typing import Any

from services.common import states
from services.common.job_errors import TENANT_MESSAGES

JSON = dict[str, Any]

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
SCHEMAS_SUPPORTED = ("invoice.v1",)
PRIORITIES = ("interactive", "batch")
MIN_DEADLINE_SECONDS = 60
MAX_DEADLINE_SECONDS = 604_800
MAX_LIST_LIMIT = 200

_UUID: JSON = {"type": "string", "pattern": UUID_PATTERN}
# PostgreSQL text cannot hold NUL; refusing it here keeps a client mistake a 422, not a 500.
_TEXT: JSON = {"type": "string", "minLength": 1, "pattern": "^[^\\u0000]*$"}
_FILENAME: JSON = {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^\\u0000-\\u001f]*$"}
_TIMESTAMP: JSON = {"type": "string", "format": "date-time"}
_STATE: JSON = {"type": "string", "enum": sorted(states.ALL)}
JOB_ERROR: JSON = {
    "type": "object",
    "required": ["class", "message"],
    "description": "A stable class and a message written for the tenant (never a provider's raw text).",
    "properties": {
        "class": {"type": "string", "enum": sorted(TENANT_MESSAGES)},
        "message": {"type": "string"},
    },
}


def create_document_request() -> JSON:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["text"],
        "properties": {
            "text": {
                **_TEXT,
                "description": "The document's text (OCR output; pages separated by form feeds).",
            },
            "filename": _FILENAME,
            "document_id": {**_UUID, "description": "Store a new version of this existing document."},
        },
    }


def create_job_request(model_policies: tuple[str, ...]) -> JSON:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "document_id": _UUID,
            "document_version": {"type": "integer", "minimum": 1, "maximum": 2_147_483_647},
            "document": {
                "type": "object",
                "additionalProperties": False,
                "required": ["text"],
                "properties": {"text": _TEXT, "filename": _FILENAME},
            },
            "schema": {"type": "string", "enum": list(SCHEMAS_SUPPORTED), "default": "invoice.v1"},
            "priority": {"type": "string", "enum": list(PRIORITIES), "default": "batch"},
            "deadline_seconds": {
                "type": "integer",
                "minimum": MIN_DEADLINE_SECONDS,
                "maximum": MAX_DEADLINE_SECONDS,
            },
            "options": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "model_policy": {"type": "string", "enum": list(model_policies)},
                    "language": {"type": "string", "pattern": "^[a-z]{2,3}(-[A-Z]{2})?$"},
                },
            },
        },
        "oneOf": [
            {
                "required": ["document"],
                "not": {"anyOf": [{"required": ["document_id"]}, {"required": ["document_version"]}]},
            },
            {"required": ["document_id", "document_version"], "not": {"required": ["document"]}},
        ],
    }


DOCUMENT: JSON = {
    "type": "object",
    "required": ["document_id", "version", "sha256", "size"],
    "properties": {
        "document_id": _UUID,
        "version": {"type": "integer", "minimum": 1},
        "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
        "size": {"type": "integer", "minimum": 0},
        "filename": {"type": ["string", "null"]},
    },
}

JOB_ACCEPTED: JSON = {
    "type": "object",
    "required": [
        "job_id",
        "state",
        "done",
        "status_url",
        "poll_after_seconds",
        "estimated_duration_seconds",
        "message",
    ],
    "properties": {
        "job_id": _UUID,
        "state": _STATE,
        "done": {"type": "boolean"},
        "state_version": {"type": "integer"},
        "status_url": {"type": "string"},
        "poll_after_seconds": {"type": "integer", "minimum": 1},
        "estimated_duration_seconds": {"type": "integer", "minimum": 0},
        "message": {"type": "string"},
    },
}

JOB_STATUS: JSON = {
    "type": "object",
    "required": [
        "job_id",
        "state",
        "done",
        "state_version",
        "attempts",
        "created_at",
        "elapsed_seconds",
        "message",
    ],
    "properties": {
        "job_id": _UUID,
        "state": _STATE,
        "done": {"type": "boolean"},
        "state_version": {"type": "integer", "minimum": 1},
        "attempts": {"type": "integer", "minimum": 0},
        "priority": {"type": "string", "enum": list(PRIORITIES)},
        "document": {
            "type": "object",
            "required": ["document_id", "version"],
            "properties": {"document_id": _UUID, "version": {"type": "integer"}},
        },
        "schema": {"type": "string"},
        "created_at": _TIMESTAMP,
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
        "deadline_at": _TIMESTAMP,
        "elapsed_seconds": {"type": "number", "minimum": 0},
        "poll_after_seconds": {"type": "integer", "minimum": 1},
        "status_url": {"type": "string"},
        "message": {"type": "string"},
        "result": {"type": ["object", "null"], "description": "the invoice.v1 extraction"},
        "policy_version": {"type": "string", "description": "the validation policy that judged it"},
        "last_error": {**JOB_ERROR, "description": "why the last attempt failed, while a retry is scheduled"},
        "review": {
            "type": "object",
            "required": ["reasons"],
            "properties": {"reasons": {"type": "array"}},
        },
        "error": JOB_ERROR,
        "erp": {
            "type": "object",
            "description": (
                "The ERP's latest business acknowledgement of a delivery of this job (posted, or "
                "rejected with a reason, which opens a review task: review_id); received_at is when "
                "the ERP answered the delivery 2xx."
            ),
            "required": ["delivery_id", "received_at", "outcome", "reason", "at"],
            "properties": {
                "delivery_id": _UUID,
                "received_at": {"type": ["string", "null"], "format": "date-time"},
                "outcome": {"type": "string", "enum": ["posted", "rejected"]},
                "reason": {"type": ["string", "null"]},
                "at": _TIMESTAMP,
                "review_id": _UUID,
            },
        },
    },
}

JOB_SUMMARY: JSON = {
    "type": "object",
    "required": ["job_id", "state", "done", "state_version", "created_at", "status_url"],
    "properties": {
        "job_id": _UUID,
        "state": _STATE,
        "done": {"type": "boolean"},
        "state_version": {"type": "integer"},
        "priority": {"type": "string"},
        "created_at": _TIMESTAMP,
        "updated_at": _TIMESTAMP,
        "status_url": {"type": "string"},
    },
}

JOB_LIST: JSON = {
    "type": "object",
    "required": ["jobs", "next_cursor"],
    "properties": {
        "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/JobSummary"}},
        "next_cursor": {"type": ["string", "null"]},
    },
}
