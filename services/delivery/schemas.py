"""JSON Schemas of the webhook-endpoint and delivery API: the server validates requests with them and
the OpenAPI document (``services/acceptance/openapi.py``) publishes them."""

from __future__ import annotations

from typing import Any

from services.delivery.acks import MAX_REASON_LENGTH, OUTCOMES
from services.delivery.egress import MAX_URL_LENGTH
from services.delivery.payload import EVENT_TYPES, SUBSCRIBABLE

JSON = dict[str, Any]

UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_UUID: JSON = {"type": "string", "pattern": UUID_PATTERN}
_TIME: JSON = {"type": "string", "format": "date-time"}
_TIME_OR_NULL: JSON = {"type": ["string", "null"], "format": "date-time"}
MAX_CONCURRENCY = 100
MAX_OVERLAP_SECONDS = 30 * 86_400
DELIVERY_STATES = ("pending", "delivering", "delivered", "failed", "dead")
MAX_ACK_BODY_BYTES = 8192

CREATE_ENDPOINT: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "url": {
            "type": "string",
            "minLength": 1,
            "maxLength": MAX_URL_LENGTH,
            "description": "https URL (plain http only to allow-listed targets); no credentials.",
        },
        "event_types": {
            "type": "array",
            "minItems": 1,
            "uniqueItems": True,
            "items": {"type": "string", "enum": list(SUBSCRIBABLE)},
            "description": (
                f"Defaults to the ERP's events ({', '.join(EVENT_TYPES)}); review.requested.v1 "
                "(ids, reasons and a review URL, never the unvalidated fields) only when named."
            ),
        },
        "max_concurrency": {"type": "integer", "minimum": 1, "maximum": MAX_CONCURRENCY},
        "secret": {
            "type": "string",
            "pattern": "^whsec_[A-Za-z0-9+/]{32,88}={0,2}$",
            "description": "Bring your own secret (whsec_ + base64 of 24-64 bytes); one is made when absent.",
        },
    },
}

ROTATE_SECRET: JSON = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "overlap_seconds": {
            "type": "integer",
            "minimum": 0,
            "maximum": MAX_OVERLAP_SECONDS,
            "description": "How long the old secret keeps signing beside the new one.",
        }
    },
}

RECOVER: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["since"],
    "properties": {"since": {**_TIME, "description": "Resend failed and dead deliveries created since."}},
}

ACK: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["outcome"],
    "properties": {
        "outcome": {
            "type": "string",
            "enum": list(OUTCOMES),
            "description": "posted: on the books; rejected: refused with a reason (opens a review task).",
        },
        "reason": {"type": "string", "minLength": 1, "maxLength": MAX_REASON_LENGTH, "pattern": "\\S"},
        "delivery_id": {
            **_UUID,
            "description": "The delivery, as in the path: binds the signature to it (recommended).",
        },
    },
    "if": {"properties": {"outcome": {"const": "rejected"}}},
    "then": {"required": ["reason"]},
    "else": {"not": {"required": ["reason"]}},
}

SECRET_INFO: JSON = {
    "type": "object",
    "required": ["key_id", "created_at", "not_after"],
    "properties": {"key_id": {"type": "string"}, "created_at": _TIME, "not_after": _TIME_OR_NULL},
}

ENDPOINT: JSON = {
    "type": "object",
    "required": ["endpoint_id", "url", "event_types", "state", "verified", "secrets"],
    "properties": {
        "endpoint_id": _UUID,
        "url": {"type": "string"},
        "event_types": {"type": "array", "items": {"type": "string"}},
        "state": {"type": "string", "enum": ["enabled", "disabled"]},
        "disabled_reason": {"type": ["string", "null"]},
        "verified": {"type": "boolean"},
        "verified_at": _TIME_OR_NULL,
        "max_concurrency": {"type": "integer"},
        "consecutive_failures": {"type": "integer"},
        "consecutive_auth_failures": {"type": "integer"},
        "breaker_open_until": _TIME_OR_NULL,
        "created_at": _TIME,
        "secrets": {"type": "array", "items": SECRET_INFO},
    },
}

ENDPOINT_CREATED: JSON = {
    "type": "object",
    "required": [*ENDPOINT["required"], "secret", "verification"],
    "properties": {
        **ENDPOINT["properties"],
        "secret": {"type": "string", "pattern": "^whsec_", "description": "Shown only this once."},
        "verification": {
            "type": "object",
            "description": "The verification ping, queued as a delivery in the registration's transaction.",
            "required": ["delivery_id", "state", "message"],
            "properties": {
                "delivery_id": _UUID,
                "state": {"type": "string", "enum": ["pending"]},
                "message": {"type": "string"},
            },
        },
    },
}

ENDPOINT_LIST: JSON = {
    "type": "object",
    "required": ["endpoints"],
    "properties": {"endpoints": {"type": "array", "items": ENDPOINT}},
}

SECRET_ROTATED: JSON = {
    "type": "object",
    "required": ["endpoint_id", "secret", "key_id", "previous_not_after"],
    "properties": {
        "endpoint_id": _UUID,
        "secret": {"type": "string", "pattern": "^whsec_"},
        "key_id": {"type": "string"},
        "previous_not_after": _TIME_OR_NULL,
    },
}

RECOVERED: JSON = {
    "type": "object",
    "required": ["endpoint_id", "resent"],
    "properties": {"endpoint_id": _UUID, "resent": {"type": "integer", "minimum": 0}},
}

ATTEMPT: JSON = {
    "type": "object",
    "required": ["attempt", "outcome"],
    "properties": {
        "attempt": {"type": "integer"},
        "started_at": _TIME,
        "ended_at": _TIME,
        "outcome": {"type": "string"},
        "http_status": {"type": ["integer", "null"]},
        "error_class": {"type": ["string", "null"]},
        "response_body": {"type": ["string", "null"]},
        "retry_after_ms": {"type": ["integer", "null"]},
        "latency_ms": {"type": ["integer", "null"]},
    },
}

DELIVERY: JSON = {
    "type": "object",
    "required": [
        "delivery_id",
        "event_id",
        "event_type",
        "endpoint_id",
        "state",
        "attempt_count",
        "attempts",
    ],
    "properties": {
        "delivery_id": _UUID,
        "event_id": _UUID,
        "event_type": {"type": "string"},
        "endpoint_id": _UUID,
        "job_id": {"type": ["string", "null"]},
        "state": {"type": "string", "enum": list(DELIVERY_STATES)},
        "reason": {"type": ["string", "null"]},
        "attempt_count": {"type": "integer", "minimum": 0},
        "last_status": {"type": ["integer", "null"]},
        "next_attempt_at": _TIME,
        "created_at": _TIME,
        "delivered_at": _TIME_OR_NULL,
        "ack": {
            "type": ["object", "null"],
            "description": "The ERP's signed business acknowledgement (POST ...:ack), if any.",
            "required": ["outcome", "reason", "acked_at"],
            "properties": {
                "outcome": {"type": "string", "enum": list(OUTCOMES)},
                "reason": {"type": ["string", "null"]},
                "acked_at": _TIME,
            },
        },
        "attempts": {"type": "array", "items": ATTEMPT},
    },
}

DELIVERY_LIST: JSON = {
    "type": "object",
    "required": ["deliveries"],
    "properties": {
        "deliveries": {"type": "array", "items": DELIVERY},
        "next_cursor": {
            "type": ["string", "null"],
            "description": "unacknowledged=1 only: pass as `cursor` for the next page; null on the last.",
        },
        "window_seconds": {
            "type": "number",
            "description": "unacknowledged=1 only: how long after receipt a delivery counts as overdue.",
        },
    },
}

COMPONENTS: JSON = {
    "CreateWebhookEndpoint": CREATE_ENDPOINT,
    "RotateWebhookSecret": ROTATE_SECRET,
    "RecoverWebhookEndpoint": RECOVER,
    "WebhookEndpoint": ENDPOINT,
    "WebhookEndpointCreated": ENDPOINT_CREATED,
    "WebhookEndpointList": ENDPOINT_LIST,
    "WebhookSecretRotated": SECRET_ROTATED,
    "WebhookEndpointRecovered": RECOVERED,
    "AcknowledgeDelivery": ACK,
    "Delivery": DELIVERY,
    "DeliveryList": DELIVERY_LIST,
}
