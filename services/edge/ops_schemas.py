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
INBOXES = ("execution_inbox", "delivery_inbox")
ENDPOINT_STATES = ("enabled", "disabled")

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

_STR_OR_NULL: JSON = {"type": ["string", "null"]}
_INT_OR_NULL: JSON = {"type": ["integer", "null"]}
_UUID: JSON = {"type": "string", "format": "uuid"}
_BREAKER: JSON = {"type": "string", "enum": ["open", "closed"]}

ATTEMPT: JSON = {
    "type": "object",
    "description": "One HTTP exchange with one provider channel (a row of job_attempts), or a lease "
    "that expired mid-attempt. Rows written before migration 0017 have no error_message nor worker_id; "
    "only streamed hops since migration 0021 have time_to_first_token_ms and inter_token_ms.",
    "required": [
        "attempt",
        "fence",
        "channel",
        "model",
        "status",
        "http_status",
        "error_class",
        "error_message",
        "retry_after_ms",
        "input_tokens",
        "output_tokens",
        "latency_ms",
        "time_to_first_token_ms",
        "inter_token_ms",
        "started_at",
        "ended_at",
        "worker_id",
    ],
    "properties": {
        "attempt": {"type": "integer"},
        "fence": {"type": "integer"},
        "channel": _STR_OR_NULL,
        "model": _STR_OR_NULL,
        "status": {
            "type": "string",
            "description": "ok, an error class, skipped (nothing sent), stale (the worker had lost the "
            "job), lease_expired, or a model error (broken_json, schema_violation, ...).",
        },
        "http_status": _INT_OR_NULL,
        "error_class": _STR_OR_NULL,
        "error_message": {**_STR_OR_NULL, "description": "The raw text: the provider's own words."},
        "retry_after_ms": _INT_OR_NULL,
        "input_tokens": _INT_OR_NULL,
        "output_tokens": _INT_OR_NULL,
        "latency_ms": _INT_OR_NULL,
        "time_to_first_token_ms": {
            **_INT_OR_NULL,
            "description": "A streamed hop's time from sending to its first content frame.",
        },
        "inter_token_ms": {
            "type": ["number", "null"],
            "description": "A streamed hop's mean time between content frames (one token each at vLLM).",
        },
        "started_at": _TIME,
        "ended_at": _TIME_OR_NULL,
        "worker_id": {**_STR_OR_NULL, "description": "The worker that made the attempt (host:pid)."},
    },
}

OPS_JOB: JSON = {
    "type": "object",
    "required": ["job_id", "tenant_id", "state", "state_version", "attempt", "fence", "error", "attempts"],
    "properties": {
        "job_id": _UUID,
        "tenant_id": _UUID,
        "state": {"type": "string"},
        "state_version": {"type": "integer"},
        "attempt": {"type": "integer"},
        "fence": {"type": "integer"},
        "priority": {"type": "string"},
        "schema": {"type": "string"},
        "model_policy": {"type": "string"},
        "model": _STR_OR_NULL,
        "claimed_by": {**_STR_OR_NULL, "description": "The worker that claimed it last."},
        "lease_until": _TIME_OR_NULL,
        "available_at": _TIME_OR_NULL,
        "deadline_at": _TIME_OR_NULL,
        "created_at": _TIME,
        "updated_at": _TIME,
        "finished_at": _TIME_OR_NULL,
        "usage": {"type": ["object", "null"]},
        "review_reasons": {
            "type": "array",
            "description": "The validation reasons' codes and fields (their messages quote the invoice).",
            "items": {"type": "object", "properties": {"code": _STR_OR_NULL, "field": _STR_OR_NULL}},
        },
        "decided_by": _STR_OR_NULL,
        "error": {
            "type": ["object", "null"],
            "required": ["class", "message", "tenant_sees"],
            "properties": {
                "class": {"type": "string"},
                "message": {**_STR_OR_NULL, "description": "The raw text the worker stored."},
                "tenant_sees": {
                    "type": "object",
                    "description": "The class and message the tenant's status and webhooks show.",
                    "required": ["class", "message"],
                    "properties": {"class": {"type": "string"}, "message": {"type": "string"}},
                },
            },
        },
        "attempts": {"type": "array", "items": {"$ref": "#/components/schemas/OpsAttempt"}},
    },
}

QUARANTINE_LIST: JSON = {
    "type": "object",
    "required": ["quarantine"],
    "properties": {
        "quarantine": {
            "type": "array",
            "description": "Events seen again with a different payload digest: kept, never applied.",
            "items": {
                "type": "object",
                "required": [
                    "id",
                    "inbox",
                    "event_id",
                    "stored_digest",
                    "received_digest",
                    "payload",
                    "received_at",
                ],
                "properties": {
                    "id": {"type": "integer"},
                    "inbox": {"type": "string", "enum": list(INBOXES)},
                    "event_id": _UUID,
                    "stored_digest": {"type": "string"},
                    "received_digest": {"type": "string"},
                    "payload": {},
                    "received_at": _TIME,
                },
            },
        }
    },
}

ENDPOINT_HEALTH: JSON = {
    "type": "object",
    "required": [
        "endpoint_id",
        "tenant_id",
        "origin",
        "state",
        "breaker",
        "consecutive_failures",
        "last_delivery",
    ],
    "properties": {
        "endpoint_id": _UUID,
        "tenant_id": _UUID,
        "origin": {
            "type": "string",
            "description": "Scheme, host and port only: an endpoint's path and query may hold the "
            "tenant's own tokens.",
        },
        "state": {"type": "string", "enum": list(ENDPOINT_STATES)},
        "disabled_reason": _STR_OR_NULL,
        "disabled_at": _TIME_OR_NULL,
        "verified": {"type": "boolean"},
        "breaker": {"type": "string", "enum": ["open", "closed"]},
        "breaker_open_until": _TIME_OR_NULL,
        "consecutive_failures": {"type": "integer"},
        "consecutive_auth_failures": {"type": "integer"},
        "max_concurrency": {"type": "integer"},
        "last_delivery": {
            "type": ["object", "null"],
            "description": "The newest attempt of the endpoint's most recently attempted delivery.",
            "properties": {
                "delivery_id": _UUID,
                "outcome": {"type": "string"},
                "http_status": _INT_OR_NULL,
                "error_class": _STR_OR_NULL,
                "at": _TIME_OR_NULL,
            },
        },
    },
}

ENDPOINT_HEALTH_LIST: JSON = {
    "type": "object",
    "required": ["endpoints"],
    "properties": {"endpoints": {"type": "array", "items": {"$ref": "#/components/schemas/EndpointHealth"}}},
}

_DIMENSION: JSON = {
    "type": "object",
    "required": ["limit", "used", "headroom"],
    "properties": {
        "limit": {"type": "integer"},
        "used": {"type": "integer"},
        "headroom": {"type": "integer", "minimum": 0},
    },
}

LIMITER_POOLS: JSON = {
    "type": "object",
    "required": ["pools"],
    "properties": {
        "pools": {
            "type": "array",
            "items": {
                "type": "object",
                "required": [
                    "pool",
                    "window_ms",
                    "requests",
                    "tokens",
                    "in_flight",
                    "cooldown_until",
                    "cooling_down",
                    "observed_at",
                ],
                "properties": {
                    "pool": {"type": "string"},
                    "window_ms": {"type": "integer", "description": "The window RPM and TPM count over."},
                    "requests": _DIMENSION,
                    "tokens": _DIMENSION,
                    "in_flight": _DIMENSION,
                    "cooldown_until": _TIME_OR_NULL,
                    "cooling_down": {"type": "boolean"},
                    "observed_at": _TIME,
                },
            },
        }
    },
}

COMPONENTS: JSON = {
    "OpsAttempt": ATTEMPT,
    "OpsJob": OPS_JOB,
    "QuarantineList": QUARANTINE_LIST,
    "EndpointHealth": ENDPOINT_HEALTH,
    "EndpointHealthList": ENDPOINT_HEALTH_LIST,
    "LimiterPools": LIMITER_POOLS,
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

    limit = {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIST_LIMIT},
    }
    return {
        "/v1/ops/jobs/{job_id}": {
            "get": {
                "operationId": "getOpsJob",
                "summary": "Operator: any tenant's job with its whole attempt log and the raw error text "
                "(what the tenant sees instead is in error.tenant_sees).",
                "security": security,
                "parameters": [{"name": "job_id", "in": "path", "required": True, "schema": _UUID}],
                "responses": responses(("200", "The job.", "OpsJob"), 400, 401, 403, 404, 503),
            }
        },
        "/v1/ops/quarantine": {
            "get": {
                "operationId": "listQuarantine",
                "summary": "Operator: inbox quarantine, newest first.",
                "security": security,
                "parameters": [
                    {"name": "inbox", "in": "query", "schema": {"type": "string", "enum": list(INBOXES)}},
                    {"name": "since", "in": "query", "schema": _SINCE},
                    limit,
                ],
                "responses": responses(("200", "Quarantined events.", "QuarantineList"), 400, 401, 403, 503),
            }
        },
        "/v1/ops/endpoints": {
            "get": {
                "operationId": "listEndpointHealth",
                "summary": "Operator: webhook endpoint health across tenants, most consecutive failures "
                "first.",
                "security": security,
                "parameters": [
                    {
                        "name": "state",
                        "in": "query",
                        "schema": {"type": "string", "enum": list(ENDPOINT_STATES)},
                    },
                    {"name": "breaker", "in": "query", "schema": _BREAKER},
                    {"name": "tenant_id", "in": "query", "schema": _UUID},
                    limit,
                ],
                "responses": responses(("200", "Endpoints.", "EndpointHealthList"), 400, 401, 403, 503),
            }
        },
        "/v1/ops/limiter/pools": {
            "get": {
                "operationId": "listLimiterPools",
                "summary": "Operator: every limiter pool's limits, use, headroom and cooldown, now.",
                "security": security,
                "responses": responses(("200", "Pools.", "LimiterPools"), 400, 401, 403, 503),
            }
        },
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
