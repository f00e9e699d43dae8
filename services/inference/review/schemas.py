"""JSON Schemas and OpenAPI path items of the review routes (``/v1/reviews``): the same dictionaries
validate requests (``api.py``) and form ``/openapi.json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSON = dict[str, Any]

MAX_LIMIT = 200
MAX_CHANGES = 100
MAX_FENCE = 9_223_372_036_854_775_807
UUID_PATTERN = "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"

_FENCE: JSON = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_FENCE,
    "description": "The fence your claim returned: a decision under an older claim is refused.",
}
_TIME_OR_NULL: JSON = {"type": ["string", "null"], "format": "date-time"}
_REASON: JSON = {
    "type": "object",
    "required": ["code"],
    "properties": {
        "code": {"type": "string"},
        "field": {"type": ["string", "null"]},
        "message": {"type": "string"},
        "detail": {"type": "object"},
    },
}

APPROVE: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["fence"],
    "properties": {"fence": _FENCE},
}
CORRECT: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["fence", "changes"],
    "properties": {
        "fence": _FENCE,
        "changes": {
            "type": "object",
            "minProperties": 1,
            "maxProperties": MAX_CHANGES,
            "propertyNames": {"pattern": "^(/[^/\\u0000]+)+$", "maxLength": 200},
            "description": (
                "The fields to change, by JSON Pointer into the extracted result (e.g. "
                '{"/total": "1170.00"}); each must exist. The corrected result is validated again '
                "under the current policy; the changed fields need no evidence."
            ),
        },
    },
}
REJECT: JSON = {
    "type": "object",
    "additionalProperties": False,
    "required": ["fence", "reason"],
    "properties": {
        "fence": _FENCE,
        "reason": {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": "^[^\\u0000]*$"},
    },
}

SUMMARY: JSON = {
    "type": "object",
    "required": ["review_id", "job_id", "kind", "state", "reasons", "created_at"],
    "properties": {
        "review_id": {"type": "string", "pattern": UUID_PATTERN},
        "job_id": {"type": "string", "pattern": UUID_PATTERN},
        "kind": {"type": "string", "enum": ["validation", "erp_rejected"]},
        "state": {"type": "string", "enum": ["open", "claimed", "approved", "corrected", "rejected"]},
        "reasons": {"type": "array", "items": _REASON},
        "claimed_by": {"type": ["string", "null"]},
        "claimed_until": _TIME_OR_NULL,
        "created_at": {"type": "string", "format": "date-time"},
        "decided_at": _TIME_OR_NULL,
        "url": {"type": "string"},
    },
}
REVIEW: JSON = {
    "type": "object",
    "required": [*SUMMARY["required"], "fence", "job", "document", "result", "evidence", "history"],
    "properties": {
        **{k: v for k, v in SUMMARY["properties"].items() if k != "url"},
        "fence": {"type": "integer"},
        "job": {"type": "object"},
        "document": {
            "type": "object",
            "required": ["document_id", "version", "text", "pages"],
            "properties": {
                "document_id": {"type": "string"},
                "version": {"type": "integer"},
                "text": {"type": "string"},
                "pages": {"type": "array", "items": {"type": "string"}},
            },
        },
        "result": {"type": ["object", "null"], "description": "The extracted fields (not validated)."},
        "evidence": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["field", "span", "text"],
                "properties": {
                    "field": {"type": "string"},
                    "span": {},
                    "text": {"type": ["string", "null"], "description": "The text the span names."},
                },
            },
        },
        "correction": {"type": ["object", "null"]},
        "decision": {"type": ["object", "null"]},
        "delivery_id": {"type": ["string", "null"]},
        "history": {"type": "array", "items": {"type": "object"}},
    },
}
REVIEW_LIST: JSON = {
    "type": "object",
    "required": ["reviews", "next_cursor"],
    "properties": {
        "reviews": {"type": "array", "items": SUMMARY},
        "next_cursor": {"type": ["string", "null"]},
    },
}
CLAIMED: JSON = {
    "type": "object",
    "required": ["review_id", "state", "fence", "claimed_until", "owner", "message"],
    "properties": {
        "review_id": {"type": "string"},
        "state": {"type": "string", "enum": ["claimed"]},
        "fence": {"type": "integer"},
        "claimed_until": {"type": "string", "format": "date-time"},
        "owner": {"type": "string"},
        "message": {"type": "string"},
    },
}

COMPONENTS: JSON = {
    "Review": REVIEW,
    "ReviewList": REVIEW_LIST,
    "ReviewClaimed": CLAIMED,
    "ApproveReview": APPROVE,
    "CorrectReview": CORRECT,
    "RejectReview": REJECT,
}


def _content(ref: str) -> JSON:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def paths(security: list[JSON], errors: Mapping[int, JSON]) -> JSON:
    review_id = [
        {
            "name": "review_id",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "pattern": UUID_PATTERN},
        }
    ]

    def op(
        op_id: str,
        summary: str,
        ok: str,
        codes: tuple[int, ...],
        *,
        body: str | None = None,
        params: Any = None,
    ) -> JSON:
        operation: JSON = {
            "operationId": op_id,
            "summary": summary,
            "security": security,
            "responses": {"200": {"description": "OK.", "content": _content(ok)}}
            | {str(c): errors[c] for c in codes},
        }
        if params:
            operation["parameters"] = params
        if body:
            operation["requestBody"] = {"required": True, "content": _content(body)}
        return operation

    listing = [
        {
            "name": "state",
            "in": "query",
            "schema": {
                "type": "string",
                "enum": ["open", "claimed", "decided", "approved", "corrected", "rejected", "all"],
                "default": "open",
            },
        },
        {"name": "cursor", "in": "query", "schema": {"type": "string", "maxLength": 200}},
        {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT}},
    ]
    decide = (400, 401, 404, 409, 415, 422, 503)
    return {
        "/v1/reviews": {
            "get": op(
                "listReviews",
                "This tenant's review tasks, oldest first. `open` includes claims that ran out.",
                "ReviewList",
                (400, 401, 503),
                params=listing,
            )
        },
        "/v1/reviews/{review_id}": {
            "get": op(
                "getReview",
                "One review: the source text and its pages, the extracted fields, the reasons, each "
                "field's evidence span with the text it names, and the audit trail.",
                "Review",
                (400, 401, 404, 503),
                params=review_id,
            )
        },
        "/v1/reviews/{review_id}:claim": {
            "post": op(
                "claimReview",
                "Claim a review: you alone may decide it until claimed_until, under the fence returned.",
                "ReviewClaimed",
                (400, 401, 404, 409, 503),
                params=review_id,
            )
        },
        "/v1/reviews/{review_id}:approve": {
            "post": op(
                "approveReview",
                "Approve the result as extracted: the job becomes SUCCEEDED (decided by a reviewer) and "
                "is delivered to the ERP.",
                "Review",
                decide,
                body="ApproveReview",
                params=review_id,
            )
        },
        "/v1/reviews/{review_id}:correct": {
            "post": op(
                "correctReview",
                "Correct fields; the corrected result is validated again (422 with the reasons if it "
                "does not pass, nothing changed) and then delivered as SUCCEEDED.",
                "Review",
                decide,
                body="CorrectReview",
                params=review_id,
            )
        },
        "/v1/reviews/{review_id}:reject": {
            "post": op(
                "rejectReview",
                "Reject the result: the job becomes REJECTED (terminal) and the ERP is told.",
                "Review",
                decide,
                body="RejectReview",
                params=review_id,
            )
        },
    }
