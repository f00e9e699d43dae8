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
_BATCH_STATE_PREFIX = "BATCH_STATE_"


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
    return {**_document(request), **_scheduling(request)}


def submit_batch_body(request: pb.SubmitBatchRequest) -> JSON:
    """The HTTP body of ``POST /v1/extraction-batches`` this request stands for."""
    items = []
    for item in request.items:
        body = _document(item)
        if item.idempotency_key:
            body["idempotency_key"] = item.idempotency_key
        items.append(body)
    return {"items": items, **_scheduling(request)}


def _document(message: pb.SubmitRequest | pb.BatchItemRequest) -> JSON:
    """The document (inline or by id) and, for an item, its own options."""
    body: JSON = {}
    if message.HasField("document"):
        document: JSON = {"text": message.document.text}
        if message.document.filename:
            document["filename"] = message.document.filename
        body["document"] = document
    if message.document_id:
        body["document_id"] = message.document_id
    if message.document_version:
        body["document_version"] = message.document_version
    if isinstance(message, pb.BatchItemRequest) and message.HasField("options"):
        body["options"] = _options(message.options)
    return body


def _scheduling(message: pb.SubmitRequest | pb.SubmitBatchRequest) -> JSON:
    """Schema, priority, deadline and (for a job, or a batch's every item) options."""
    body: JSON = {}
    if message.schema:
        body["schema"] = message.schema
    if message.priority != pb.PRIORITY_UNSPECIFIED:
        name = pb.Priority.Name(message.priority) if message.priority in pb.Priority.values() else ""
        body["priority"] = name.removeprefix(_PRIORITY_PREFIX).lower() or str(message.priority)
    if message.deadline_seconds:
        body["deadline_seconds"] = message.deadline_seconds
    if message.HasField("options"):
        body["options"] = _options(message.options)
    return body


def _options(options: pb.Options) -> JSON:
    given = {"model_policy": options.model_policy, "language": options.language}
    return {key: value for key, value in given.items() if value}


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
    return _parse(_errors(_enums(status)), pb.JobStatus())


def job_list(page: JSON) -> pb.ListResponse:
    return pb.ListResponse(
        jobs=[_parse(_enums(job), pb.JobSummary()) for job in page["jobs"]],
        next_cursor=page["next_cursor"] or "",
    )


def batch_response(accepted: JSON, *, replayed: bool) -> pb.SubmitBatchResponse:
    return _parse({**_batch_state(accepted), "replayed": replayed}, pb.SubmitBatchResponse())


def batch_status(status: JSON) -> pb.BatchStatus:
    body = _batch_state(status)
    body["priority"] = _PRIORITY_PREFIX + str(body["priority"]).upper()
    return _parse(body, pb.BatchStatus())


def batch_items(page: JSON) -> pb.ListBatchItemsResponse:
    return pb.ListBatchItemsResponse(
        batch_id=page["batch_id"],
        items=[_parse(_errors(_enums(item)), pb.BatchItem()) for item in page["items"]],
        next_cursor=page["next_cursor"] or "",
    )


def _enums(body: JSON) -> JSON:
    out = dict(body)
    if isinstance(out.get("state"), str):
        out["state"] = _STATE_PREFIX + out["state"]
    if isinstance(out.get("priority"), str):
        out["priority"] = _PRIORITY_PREFIX + out["priority"].upper()
    return out


def _batch_state(body: JSON) -> JSON:
    # A batch's state is lower case on the wire ("completed_with_errors"); not a job state.
    return {**body, "state": _BATCH_STATE_PREFIX + str(body["state"]).upper()}


def _errors(body: JSON) -> JSON:
    for key in ("error", "last_error"):
        if isinstance(body.get(key), dict):
            error = dict(body[key])
            error["error_class"] = error.pop("class", "")
            body[key] = error
    return body


def _parse(body: JSON, message: M) -> M:
    # A field the HTTP body gains before the proto does is left out here rather than failing the
    # call; tests/jobs_grpc/test_messages.py keeps the two in step.
    return json_format.ParseDict(body, message, ignore_unknown_fields=True)
