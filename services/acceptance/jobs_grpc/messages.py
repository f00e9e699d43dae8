"""Protobuf messages to and from the HTTP API's bodies. Pure.

A request becomes the JSON body the HTTP route would have received, so the same schema, parser and
service decide it; an answer is the HTTP body (built by ``views``, the one source of its wording)
moved field for field into its message. Only the spelling changes: enum names gain their prefix
(``READY`` → ``JOB_STATE_READY``), an error's ``class`` is ``error_class``, ``null`` is "unset".
"""

from __future__ import annotations

from typing import Any, TypeVar

from google.protobuf import json_format
from google.protobuf.message import Message

from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

JSON = dict[str, Any]
M = TypeVar("M", bound=Message)

_STATE_PREFIX = "JOB_STATE_"
_PRIORITY_PREFIX = "PRIORITY_"


def state_name(value: int) -> str | None:
    """The wire state of a ``JobState`` (None for UNSPECIFIED); an unknown number stays visible, so
    validation names it."""
    if value == pb.JOB_STATE_UNSPECIFIED:
        return None
    name = pb.JobState.Name(pb.JobState.ValueType(value)) if value in pb.JobState.values() else str(value)
    return name.removeprefix(_STATE_PREFIX)


def submit_body(request: pb.SubmitRequest) -> JSON:
    """The HTTP body of ``POST /v1/extraction-jobs`` this request stands for; an empty string or a
    zero is a field not given."""
    body: JSON = {}
    if request.HasField("document"):
        document: JSON = {"text": request.document.text}
        if request.document.filename:
            document["filename"] = request.document.filename
        body["document"] = document
    if request.document_id:
        body["document_id"] = request.document_id
    if request.document_version:
        body["document_version"] = request.document_version
    if request.schema:
        body["schema"] = request.schema
    if request.priority != pb.PRIORITY_UNSPECIFIED:
        name = pb.Priority.Name(request.priority) if request.priority in pb.Priority.values() else ""
        body["priority"] = name.removeprefix(_PRIORITY_PREFIX).lower() or str(request.priority)
    if request.deadline_seconds:
        body["deadline_seconds"] = request.deadline_seconds
    if request.HasField("options"):
        options = {"model_policy": request.options.model_policy, "language": request.options.language}
        body["options"] = {key: value for key, value in options.items() if value}
    return body


def submit_response(accepted: JSON, *, replayed: bool) -> pb.SubmitResponse:
    # Built field by field, not parsed: the answer every Submit pays for.
    return pb.SubmitResponse(
        job_id=accepted["job_id"],
        state=pb.JobState.Value(_STATE_PREFIX + accepted["state"]),
        done=accepted["done"],
        state_version=accepted["state_version"],
        status_url=accepted["status_url"],
        poll_after_seconds=accepted["poll_after_seconds"],
        estimated_duration_seconds=accepted["estimated_duration_seconds"],
        message=accepted["message"],
        replayed=replayed,
    )


def job_status(status: JSON) -> pb.JobStatus:
    body = _enums(status)
    for key in ("error", "last_error"):
        if isinstance(body.get(key), dict):
            error = dict(body[key])
            error["error_class"] = error.pop("class", "")
            body[key] = error
    return _parse(body, pb.JobStatus())


def job_list(page: JSON) -> pb.ListResponse:
    return pb.ListResponse(
        jobs=[_parse(_enums(job), pb.JobSummary()) for job in page["jobs"]],
        next_cursor=page["next_cursor"] or "",
    )


def _enums(body: JSON) -> JSON:
    out = dict(body)
    if isinstance(out.get("state"), str):
        out["state"] = _STATE_PREFIX + out["state"]
    if isinstance(out.get("priority"), str):
        out["priority"] = _PRIORITY_PREFIX + out["priority"].upper()
    return out


def _parse(body: JSON, message: M) -> M:
    # A field the HTTP body gains before the proto does is left out here rather than failing the
    # call; tests/jobs_grpc/test_messages.py keeps the two in step.
    return json_format.ParseDict(body, message, ignore_unknown_fields=True)
