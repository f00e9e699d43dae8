"""The event streams' part of ``/openapi.json``: two ``text/event-stream`` routes, and the JSON each
frame's ``data`` carries (OpenAPI 3.1 cannot type the items of a stream, so the frames are named in
the description and their bodies are components)."""

from __future__ import annotations

from services.acceptance import schemas
from services.common import states
from services.common.api.openapi import ERRORS, JSON

_STATE = {"type": "string", "enum": sorted(states.ALL)}
_ID = {"type": "string", "pattern": schemas.UUID_PATTERN}

COMPONENTS: JSON = {
    "JobEvent": {
        "type": "object",
        "description": "A job changed (`kind` state), a review closed without a new state (review), or "
        "the ERP acknowledged it (erp_ack). GET status_url for the authoritative status.",
        "required": ["seq", "job_id", "state", "state_version", "kind", "at", "done", "status_url"],
        "properties": {
            "seq": {"type": "integer", "minimum": 1, "description": "The frame's id: resume after it."},
            "job_id": _ID,
            "state": _STATE,
            "state_version": {"type": "integer", "minimum": 1},
            "kind": {"type": "string", "enum": ["state", "review", "erp_ack"]},
            "at": {"type": "string", "format": "date-time"},
            "done": {"type": "boolean", "description": "The job has its final answer."},
            "status_url": {"type": "string"},
        },
    },
    "EventSnapshot": {
        "type": "object",
        "description": "The stream's jobs as they are now: sent first when the stream has no cursor "
        "(reason no_cursor) or when events after its cursor were deleted (cursor_expired). A tenant's "
        "snapshot lists its unfinished jobs, newest first, at most 1,000.",
        "required": ["type", "reason", "seq", "jobs", "truncated", "message"],
        "properties": {
            "type": {"const": "snapshot"},
            "reason": {"type": "string", "enum": ["no_cursor", "cursor_expired"]},
            "seq": {"type": "integer", "minimum": 0},
            "jobs": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["job_id", "state", "state_version", "done", "status_url"],
                    "properties": {
                        "job_id": _ID,
                        "state": _STATE,
                        "state_version": {"type": "integer"},
                        "done": {"type": "boolean"},
                        "status_url": {"type": "string"},
                    },
                },
            },
            "truncated": {"type": "boolean"},
            "message": {"type": "string"},
        },
    },
    "EventStreamEnd": {
        "type": "object",
        "description": "The server closed the stream and says why.",
        "required": ["type", "reason", "message"],
        "properties": {
            "type": {"const": "end"},
            "reason": {"type": "string", "enum": ["key_revoked", "shutdown"]},
            "message": {"type": "string"},
        },
    },
}

_STREAM_DESCRIPTION = (
    "A text/event-stream that stays open. Frames: job events (no `event:` line; `id:` is the event's "
    "seq, `data:` a JobEvent), `event: snapshot` (data: EventSnapshot; its `id:` is where the stream "
    "goes on from), `event: end` (data: EventStreamEnd; the server closes the stream after it), and "
    "`: heartbeat` comments when nothing happened for a while. Reconnect with the last `id:` seen in "
    "`Last-Event-ID` to get what was missed; a job's state_version never goes backwards on a stream."
)


def _stream_operation(operation_id: str, summary: str, security: list[JSON], job: bool) -> JSON:
    parameters: list[JSON] = [
        {
            "name": "Last-Event-ID",
            "in": "header",
            "required": False,
            "description": "The id of the last event received: the stream replays what came after it "
            "(within the retention; older gets a snapshot first). Without it the stream starts with a "
            "snapshot.",
            "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
        }
    ]
    if job:
        parameters.insert(0, {"name": "job_id", "in": "path", "required": True, "schema": _ID})
    responses: JSON = {
        "200": {
            "description": _STREAM_DESCRIPTION,
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        "400": ERRORS[400],
        "401": ERRORS[401],
        "503": ERRORS[503],
    }
    if job:
        responses["404"] = ERRORS[404]
    return {
        "operationId": operation_id,
        "summary": summary,
        "security": security,
        "parameters": parameters,
        "responses": responses,
    }


def paths(security: list[JSON]) -> JSON:
    return {
        "/v1/events": {
            "get": _stream_operation(
                "streamEvents", "Stream the events of every job of the tenant (SSE).", security, job=False
            )
        },
        "/v1/extraction-jobs/{job_id}/events": {
            "get": _stream_operation(
                "streamJobEvents",
                "Stream the events of one job (SSE). Another tenant's job is 404.",
                security,
                job=True,
            )
        },
    }
