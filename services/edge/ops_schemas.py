"""JSON Schemas and OpenAPI path items of the operator routes (``/v1/ops/...``).

The same dictionaries validate requests (``services/acceptance/ops.py``) and form ``/openapi.json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.deadletters import SINCE_PATTERN

JSON = dict[str, Any]

MAX_ID = 9_223_372_036_854_775_807  # bigint
MAX_LIST_LIMIT = 1000
MAX_REDRIVE_IDS = 1000

# PostgreSQL text cannot hold NUL; refusing it here keeps a client mistake a 4xx, not a 500.
_TEXT: JSON = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "^[^\\u0000]*$"}
_SINCE: JSON = {
    "type": "string",
    "maxLength": 40,
    "pattern": SINCE_PATTERN,
    "description": "A time back from now (30m, 2h, 7d) or an ISO 8601 date or date-time (UTC unless "
    "it says otherwise).",
}
_ID: JSON = {"type": "integer", "minimum": 1, "maximum": MAX_ID}
_TIME: JSON = {"type": "string", "format": "date-time"}
_TIME_OR_NULL: JSON = {"type": ["string", "null"], "format": "date-time"}

DEAD_LETTER_SUMMARY: JSON = {
    "type": "object",
    "required": [
        "id",
        "queue",
        "actor",
        "message_id",
        "reason",
        "detail",
        "source",
        "at",
        "redrive_requested_at",
        "redriven_at",
        "redrive_count",
    ],
    "properties": {
        "id": {"type": "integer"},
        "queue": {"type": "string", "description": "The queue the message was taken off."},
        "actor": {"type": "string"},
        "message_id": {"type": ["string", "null"], "description": "For an event: the event id."},
        "reason": {
            "type": "string",
            "description": "Why: malformed, unknown_type, digest_conflict, unexpected_error, "
            "delivery_limit, undecodable, ...",
        },
        "detail": {"type": "string"},
        "source": {"type": "string", "enum": ["consumer", "broker"]},
        "at": _TIME,
        "redrive_requested_at": _TIME_OR_NULL,
        "redriven_at": _TIME_OR_NULL,
        "redrive_count": {"type": "integer", "minimum": 0},
    },
}

DEAD_LETTER: JSON = {
    "allOf": [
        {"$ref": "#/components/schemas/DeadLetterSummary"},
        {
            "type": "object",
            "required": ["message", "body"],
            "properties": {
                "message": {
                    "type": ["object", "null"],
                    "description": "The whole broker message, as it will be published again; null "
                    "when the body was not a message (it cannot be redriven).",
                },
                "body": {"type": "string", "description": "The body as received (an excerpt)."},
            },
        },
    ]
}

DEAD_LETTER_LIST: JSON = {
    "type": "object",
    "required": ["dead_letters"],
    "properties": {
        "dead_letters": {"type": "array", "items": {"$ref": "#/components/schemas/DeadLetterSummary"}}
    },
}

REDRIVE_REQUEST: JSON = {
    "type": "object",
    "additionalProperties": False,
    "minProperties": 1,
    "description": "What to redrive: the listed ids, or every open dead letter matching the filters "
    "(all of them must match). At least one is required.",
    "properties": {
        "ids": {"type": "array", "minItems": 1, "maxItems": MAX_REDRIVE_IDS, "items": _ID},
        "since": _SINCE,
        "reason": _TEXT,
        "queue": {**_TEXT, "description": "In full, or without the deployment's prefix (inference.ingest)."},
    },
}

REDRIVE_REQUESTED: JSON = {
    "type": "object",
    "required": ["requested", "unsendable", "already_redriven"],
    "properties": {
        "requested": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "Marked for redrive: the scheduler of the queue's service publishes each "
            "again (with its original message id) within a sweep of about 5 seconds.",
        },
        "unsendable": {
            "type": "array",
            "items": {"type": "integer"},
            "description": "Selected, but the body was not a message: nothing can be published.",
        },
        "already_redriven": {"type": "array", "items": {"type": "integer"}},
    },
}

COMPONENTS: JSON = {
    "DeadLetterSummary": DEAD_LETTER_SUMMARY,
    "DeadLetter": DEAD_LETTER,
    "DeadLetterList": DEAD_LETTER_LIST,
    "RedriveRequest": REDRIVE_REQUEST,
    "RedriveRequested": REDRIVE_REQUESTED,
}


def _json(ref: str) -> JSON:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def paths(security: list[JSON], errors: Mapping[int, JSON]) -> JSON:
    """``errors`` maps a status code to the edge's shared error response object."""

    def responses(ok: tuple[str, str, str], *codes: int) -> JSON:
        status, description, ref = ok
        return {status: {"description": description, "content": _json(ref)}} | {
            str(c): errors[c] for c in codes
        }

    return {
        "/v1/ops/dead-letters": {
            "get": {
                "operationId": "listDeadLetters",
                "summary": "Operator: dead letters, newest first (open ones unless include_redriven).",
                "security": security,
                "parameters": [
                    {"name": "since", "in": "query", "schema": _SINCE},
                    {"name": "reason", "in": "query", "schema": _TEXT},
                    {"name": "queue", "in": "query", "schema": _TEXT},
                    {"name": "include_redriven", "in": "query", "schema": {"type": "boolean"}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
                    },
                ],
                "responses": responses(("200", "Dead letters.", "DeadLetterList"), 400, 401, 403, 503),
            }
        },
        "/v1/ops/dead-letters/{dead_letter_id}": {
            "get": {
                "operationId": "getDeadLetter",
                "summary": "Operator: one dead letter with the whole stored message.",
                "security": security,
                "parameters": [{"name": "dead_letter_id", "in": "path", "required": True, "schema": _ID}],
                "responses": responses(("200", "The dead letter.", "DeadLetter"), 400, 401, 403, 404, 503),
            }
        },
        "/v1/ops/dead-letters:redrive": {
            "post": {
                "operationId": "redriveDeadLetters",
                "summary": "Operator: ask for a redrive. Answers 202: the schedulers publish each "
                "message again within a sweep; consumers dedup by event id, so asking twice is safe.",
                "security": security,
                "requestBody": {"required": True, "content": _json("RedriveRequest")},
                "responses": responses(
                    ("202", "Requested.", "RedriveRequested"), 400, 401, 403, 404, 413, 415, 422, 503
                ),
            }
        },
    }
