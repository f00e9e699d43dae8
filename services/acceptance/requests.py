"""Turn a parsed request body into typed documents and jobs, or a typed client error. No I/O here;
the body itself is read by ``services.common.api.body``."""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError

from services.acceptance import schemas
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.common.api.errors import ApiError, PayloadTooLarge, Unprocessable
from services.common.api.schema import RequestSchema

_MAX_REPORTED_ERRORS = 10
_MAX_CURSOR_LENGTH = 512
DEFAULT_LIST_LIMIT = 50


@dataclass(frozen=True)
class DocumentBody:
    text: str
    filename: str | None
    size_bytes: int
    sha256: str


@dataclass(frozen=True)
class DocumentRef:
    document_id: uuid.UUID
    version: int


@dataclass(frozen=True)
class CreateDocument:
    body: DocumentBody
    new_version_of: uuid.UUID | None


@dataclass(frozen=True)
class CreateJob:
    document: DocumentBody | DocumentRef
    schema: str
    priority: str
    deadline_seconds: int
    options: dict[str, Any]


@dataclass(frozen=True)
class ListJobs:
    state: str | None
    cursor: str | None
    limit: int


def list_jobs(state: str | None, cursor: str | None, limit: str | None) -> ListJobs:
    """The parameters of a job listing as the client sent them (None: not given), checked."""
    if state is not None and state not in states.ALL:
        raise ApiError(
            f"state must be one of {sorted(states.ALL)}", code="invalid_query", details={"parameter": "state"}
        )
    raw_limit = str(DEFAULT_LIST_LIMIT) if limit is None else limit
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= schemas.MAX_LIST_LIMIT:
        raise ApiError(
            f"limit must be an integer from 1 to {schemas.MAX_LIST_LIMIT}",
            code="invalid_query",
            details={"parameter": "limit"},
        )
    if cursor is not None and len(cursor) > _MAX_CURSOR_LENGTH:
        raise ApiError("the cursor is not one this server issued", code="invalid_cursor")
    return ListJobs(state, cursor, int(raw_limit))


class RequestParser:
    def __init__(self, settings: AcceptanceSettings) -> None:
        self._settings = settings
        self._document = RequestSchema(schemas.create_document_request())
        self._job = RequestSchema(schemas.create_job_request((settings.model_policy,)))

    def create_document(self, body: Any) -> CreateDocument:
        validate_body(self._document, body)
        new_version_of = uuid.UUID(body["document_id"]) if "document_id" in body else None
        return CreateDocument(self.document_body(body), new_version_of)

    def create_job(self, body: Any) -> CreateJob:
        validate_body(self._job, body)
        document: DocumentBody | DocumentRef
        if "document" in body:
            document = self.document_body(body["document"])
        else:
            document = DocumentRef(uuid.UUID(body["document_id"]), int(body["document_version"]))
        return CreateJob(
            document=document,
            schema=body.get("schema", "invoice.v1"),
            priority=body.get("priority", "batch"),
            deadline_seconds=int(body.get("deadline_seconds", self._settings.default_deadline_seconds)),
            options=dict(body.get("options", {})),
        )

    def document_body(self, body: dict[str, Any]) -> DocumentBody:
        text: str = body["text"]
        filename: str | None = body.get("filename")
        try:
            data = text.encode("utf-8")
            if filename is not None:
                filename.encode("utf-8")
        except UnicodeEncodeError:
            raise Unprocessable(
                "the document text or filename holds an unpaired surrogate and is not valid Unicode",
                code="invalid_text",
            ) from None
        if len(data) > self._settings.max_document_bytes:
            raise PayloadTooLarge(
                f"the document is {len(data)} bytes; the limit is {self._settings.max_document_bytes}",
                code="document_too_large",
                details={"size": len(data), "max_bytes": self._settings.max_document_bytes},
            )
        return DocumentBody(text, filename, len(data), hashlib.sha256(data).hexdigest())


def validate_body(validator: Any, body: Any) -> None:
    found = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
    if not found:
        return
    errors = [_describe(e) for e in found[:_MAX_REPORTED_ERRORS]]
    raise Unprocessable(
        "the request does not match the schema: " + "; ".join(f"{e['path']}: {e['message']}" for e in errors),
        details={"errors": errors},
    )


def _describe(error: ValidationError) -> dict[str, str]:
    path = "/" + "/".join(str(p) for p in error.absolute_path)
    message = error.message
    if error.validator == "oneOf":
        message = "send either `document` (inline text) or both `document_id` and `document_version`"
    elif error.validator == "pattern" and isinstance(error.instance, str) and len(error.instance) > 80:
        message = f"the value does not match the required pattern {error.validator_value!r}"
    elif len(message) > 300:
        message = message[:300] + "..."
    return {"path": path, "message": message}
