"""The API's typed errors as gRPC statuses, decided in one table, with google.rpc details.

An ``ApiError`` carries an HTTP status, a stable code, words and details; the gRPC answer carries
the same words, a status code from ``CODE_BY_STATUS`` (or ``CODE_BY_ERROR`` where one HTTP status
means two gRPC ones), and in ``grpc-status-details-bin`` an ErrorInfo (reason = the code in upper
case, metadata = the details), a BadRequest naming each bad field, a RetryInfo with the delay the
HTTP API puts in Retry-After, and a ResourceInfo for the job an idempotency key already names.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from services.common.api.errors import ApiError

DOMAIN = "fatura"
# ALREADY_EXISTS names what the key already stands for: the detail that holds its id, and its type.
RESOURCES = (("job_id", "fatura.jobs.v1.Job"), ("batch_id", "fatura.jobs.v1.Batch"))

CODE_BY_STATUS: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
}
# Where one HTTP status stands for gRPC codes a client handles differently.
CODE_BY_ERROR: dict[str, grpc.StatusCode] = {
    # 409: the key names another request's job (never retry as is) ...
    "idempotency_key_reused": grpc.StatusCode.ALREADY_EXISTS,
    # ... or the first request with this key did not complete (retry the same request).
    "idempotency_key_in_flight": grpc.StatusCode.ABORTED,
}
# The request field a 4xx is about, when the error itself does not say (its ``details`` may:
# ``errors`` from schema validation, ``parameter`` from a listing's parameters).
FIELD_BY_ERROR: dict[str, str] = {
    "idempotency_key_missing": "idempotency_key",
    "idempotency_key_invalid": "idempotency_key",
    "document_too_large": "document.text",
    "invalid_text": "document.text",
    "document_not_found": "document_id",
    "invalid_cursor": "cursor",
    "duplicate_item_key": "idempotency_key",
}
# A schema violation of the whole request (path "/") is the choice between an inline document and
# a stored one: the one rule that spans fields.
_WHOLE_REQUEST_FIELD = "document"


def grpc_code(error: ApiError) -> grpc.StatusCode:
    if error.code in CODE_BY_ERROR:
        return CODE_BY_ERROR[error.code]
    if error.status in CODE_BY_STATUS:
        return CODE_BY_STATUS[error.status]
    return grpc.StatusCode.INVALID_ARGUMENT if 400 <= error.status < 500 else grpc.StatusCode.INTERNAL


def to_status(error: ApiError) -> grpc.Status:
    """The gRPC status for ``error``: code, message and google.rpc details."""
    code = grpc_code(error)
    details = [_error_info(error)]
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        details.append(_bad_request(error))
    delay = retry_after_seconds(error)
    if delay is not None:
        details.append(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=delay)))
    if code == grpc.StatusCode.ALREADY_EXISTS:
        details.extend(
            error_details_pb2.ResourceInfo(
                resource_type=kind, resource_name=str(error.details[key]), description=error.message
            )
            for key, kind in RESOURCES
            if key in error.details
        )
    status = status_pb2.Status(code=code.value[0], message=error.message, details=[_pack(d) for d in details])
    return rpc_status.to_status(status)


def retry_after_seconds(error: ApiError) -> int | None:
    raw = error.headers.get("Retry-After", error.details.get("retry_after_seconds"))
    try:
        return None if raw is None else max(0, int(raw))
    except (TypeError, ValueError):
        return None


def field_violations(error: ApiError) -> list[tuple[str, str]]:
    """(field, description) for each bad field, named as in the proto: ``document.text``, or
    ``items[3].document.text`` for an item of a batch."""
    errors = error.details.get("errors")
    if isinstance(errors, list) and errors:
        return [(_field(str(e.get("path", "/"))), str(e.get("message", error.message))) for e in errors]
    parameter = error.details.get("parameter")
    field = str(parameter) if parameter is not None else FIELD_BY_ERROR.get(error.code, "")
    item = _item(error.details)
    return [(".".join(part for part in (item, field) if part), error.message)]


def _field(json_path: str) -> str:
    parts = [part for part in json_path.split("/") if part]
    field = ""
    for part in parts:
        field += f"[{part}]" if part.isdigit() else f".{part}"
    return field.lstrip(".") or _WHOLE_REQUEST_FIELD


def _item(details: Mapping[str, Any]) -> str:
    """The batch item an error is about (``index``, or the later of two ``indexes``): ``items[3]``."""
    index = details.get("index")
    indexes = details.get("indexes")
    if index is None and isinstance(indexes, list) and indexes:
        index = indexes[-1]
    return f"items[{index}]" if isinstance(index, int) else ""


def _bad_request(error: ApiError) -> error_details_pb2.BadRequest:
    return error_details_pb2.BadRequest(
        field_violations=[
            error_details_pb2.BadRequest.FieldViolation(field=field, description=description)
            for field, description in field_violations(error)
        ]
    )


def _error_info(error: ApiError) -> error_details_pb2.ErrorInfo:
    return error_details_pb2.ErrorInfo(
        reason=error.code.upper(), domain=DOMAIN, metadata=_metadata(error.details)
    )


def _metadata(details: Mapping[str, Any]) -> dict[str, str]:
    # ErrorInfo metadata is text to text; field violations already carry the schema errors.
    return {
        key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
        for key, value in details.items()
        if key != "errors" and value is not None
    }


def _pack(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed
