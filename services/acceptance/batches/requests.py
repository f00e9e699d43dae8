"""A batch request as typed values: each item the ``CreateJob`` the single-job route would make, and
its key. No I/O; a body that does not fit is a typed client error naming the item."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from services.acceptance.batches import schemas, views
from services.acceptance.requests import (
    DEFAULT_LIST_LIMIT,
    CreateJob,
    DocumentBody,
    DocumentRef,
    RequestParser,
    validate_body,
)
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.common.api.errors import ApiError, Unprocessable
from services.common.api.schema import RequestSchema


@dataclass(frozen=True)
class BatchItem:
    job: CreateJob
    # None: derived from the batch's key and the item's index (``item_key``).
    idempotency_key: str | None = None


@dataclass(frozen=True)
class CreateBatch:
    items: tuple[BatchItem, ...]
    priority: str = "batch"


def item_key(batch_key: str, index: int) -> str:
    """An item's key when it brings none. The space cannot occur in a key a client sends (visible
    ASCII only), so a derived key never meets a single job's key or another batch's item."""
    return f"{batch_key} #{index}"


def item_keys(batch_key: str, batch: CreateBatch) -> list[str]:
    """Every item's idempotency key, in order; two items with one key are a client error."""
    keys = [item.idempotency_key or item_key(batch_key, i) for i, item in enumerate(batch.items)]
    first: dict[str, int] = {}
    for index, key in enumerate(keys):
        if key in first:
            raise Unprocessable(
                f"items {first[key]} and {index} have the same idempotency_key {key!r}; each item needs "
                "its own",
                code="duplicate_item_key",
                details={"indexes": [first[key], index], "idempotency_key": key},
            )
        first[key] = index
    return keys


@dataclass(frozen=True)
class ListItems:
    state: str | None
    cursor: str | None
    limit: int


def list_items(state: str | None, cursor: str | None, limit: str | None) -> ListItems:
    """The parameters of a batch's item listing as the client sent them (None: not given), checked."""
    if state is not None and state not in states.ALL and state != views.ERRORS:
        raise ApiError(
            f"state must be a job state or {views.ERRORS!r} (every item without a result)",
            code="invalid_query",
            details={"parameter": "state"},
        )
    raw_limit = str(DEFAULT_LIST_LIMIT) if limit is None else limit
    most = schemas.MAX_ITEMS_LIMIT
    if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= most:
        raise ApiError(
            f"limit must be an integer from 1 to {most}", code="invalid_query", details={"parameter": "limit"}
        )
    return ListItems(state, cursor, int(raw_limit))


class BatchParser:
    def __init__(self, settings: AcceptanceSettings, jobs: RequestParser | None = None) -> None:
        self._settings = settings
        self._jobs = jobs or RequestParser(settings)
        self._batch = RequestSchema(
            schemas.create_batch_request((settings.model_policy,), settings.max_batch_items)
        )

    def create_batch(self, body: Any) -> CreateBatch:
        validate_body(self._batch, body)
        priority: str = body.get("priority", "batch")
        schema: str = body.get("schema", "invoice.v1")
        deadline = int(body.get("deadline_seconds", self._settings.default_deadline_seconds))
        options: dict[str, Any] = dict(body.get("options", {}))
        items = []
        for index, item in enumerate(body["items"]):
            document: DocumentBody | DocumentRef
            if "document" in item:
                document = self._document(index, item["document"])
            else:
                document = DocumentRef(uuid.UUID(item["document_id"]), int(item["document_version"]))
            job = CreateJob(
                document=document,
                schema=schema,
                priority=priority,
                deadline_seconds=deadline,
                options=dict(item["options"]) if "options" in item else options,
            )
            items.append(BatchItem(job, item.get("idempotency_key")))
        return CreateBatch(tuple(items), priority)

    def _document(self, index: int, body: dict[str, Any]) -> DocumentBody:
        try:
            return self._jobs.document_body(body)
        except ApiError as exc:
            raise ApiError(
                f"item {index}: {exc.message}",
                code=exc.code,
                status=exc.status,
                details={**exc.details, "index": index},
            ) from None
