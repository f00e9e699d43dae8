"""The bodies and keys of the client's requests, as plain functions shared by both clients."""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeAlias

from fatura_sdk.models import StoredDocument

JSON = dict[str, Any]

Document: TypeAlias = str | os.PathLike[str] | StoredDocument
"""A document to extract: its text (inline), a path to a UTF-8 text file (inline, named after the
file), or a ``StoredDocument`` uploaded earlier (by reference)."""

BatchEntry: TypeAlias = Document | Mapping[str, Any]
"""A batch item: a ``Document``, or an item body as the API takes it (``document`` or
``document_id`` + ``document_version``, optionally ``options`` and its own ``idempotency_key``)."""


def new_idempotency_key(prefix: str = "sdk") -> str:
    """A key for one logical submission; the client sends it again on every retry of that submission."""
    return f"{prefix}-{uuid.uuid4()}"


def document_fields(document: Document, filename: str | None = None) -> JSON:
    """The part of a job body that names its document."""
    if isinstance(document, StoredDocument):
        if filename is not None:
            raise ValueError("a stored document already has its filename; pass filename only with text")
        return {"document_id": document.document_id, "document_version": document.version}
    if isinstance(document, str):
        inline: JSON = {"text": document}
        if filename is not None:
            inline["filename"] = filename
        return {"document": inline}
    if isinstance(document, os.PathLike):
        path = Path(document)
        return {"document": {"text": path.read_text(encoding="utf-8"), "filename": filename or path.name}}
    raise TypeError(f"a document is text, a path or a StoredDocument, not {type(document).__name__}")


def _options(
    schema: str | None, priority: str | None, deadline_seconds: int | None, options: Mapping[str, Any] | None
) -> JSON:
    body: JSON = {}
    if schema is not None:
        body["schema"] = schema
    if priority is not None:
        body["priority"] = priority
    if deadline_seconds is not None:
        body["deadline_seconds"] = deadline_seconds
    if options:
        body["options"] = dict(options)
    return body


def job_body(
    document: Document,
    *,
    filename: str | None = None,
    schema: str | None = None,
    priority: str | None = None,
    deadline_seconds: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> JSON:
    return {**document_fields(document, filename), **_options(schema, priority, deadline_seconds, options)}


def batch_item(entry: BatchEntry) -> JSON:
    if isinstance(entry, Mapping):
        return dict(entry)
    return document_fields(entry)


def batch_body(
    items: Sequence[BatchEntry],
    *,
    schema: str | None = None,
    priority: str | None = None,
    deadline_seconds: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> JSON:
    if isinstance(items, str | bytes) or not items:
        raise ValueError("a batch needs a non-empty sequence of items")
    return {"items": [batch_item(i) for i in items], **_options(schema, priority, deadline_seconds, options)}


def list_params(state: str | None, cursor: str | None, limit: int | None) -> dict[str, str]:
    params: dict[str, str] = {}
    if state is not None:
        params["state"] = state
    if cursor is not None:
        params["cursor"] = cursor
    if limit is not None:
        params["limit"] = str(limit)
    return params
