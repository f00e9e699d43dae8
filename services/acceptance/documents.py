"""Storing documents: immutable once written; a new version is a new row.

Each tenant may store at most ``max_stored_bytes`` of documents (429 + Retry-After beyond it,
read in O(1) from counters a trigger keeps); documents no job references are deleted after
``FATURA_DOCUMENT_RETENTION_DAYS`` by the relay's housekeeping (``prune_documents``).
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from services.acceptance.queries import Q
from services.acceptance.requests import CreateDocument
from services.common.api.errors import ApiError, Conflict, NotFound
from services.common.api.tenancy import Tenant
from services.common.ids import new_id

JSON = dict[str, Any]

_VERSION_RACE_RETRIES = 5


class StorageQuotaExceeded(ApiError):
    status = 429
    code = "stored_bytes"


async def store_document(
    pool: AsyncConnectionPool[Any], tenant: Tenant, request: CreateDocument, *, retry_after_seconds: int
) -> JSON:
    body = request.body
    async with pool.connection() as conn:
        used = await (await conn.execute(Q["stored_bytes"], {"tenant_id": tenant.id})).fetchone()
    stored = int(used["bytes"]) if used else 0
    limit = tenant.limits.max_stored_bytes
    if stored + body.size_bytes > limit:
        raise StorageQuotaExceeded(
            f"storing {body.size_bytes} more bytes would pass this tenant's document storage limit "
            f"({stored} of {limit} bytes in use); documents no job uses are deleted after the retention "
            "period. Nothing was written.",
            headers={"Retry-After": str(retry_after_seconds)},
            details={"limit": "stored_bytes", "current": stored, "maximum": limit},
        )
    params = {
        "tenant_id": tenant.id,
        "document_id": request.new_version_of or new_id(),
        "sha256": body.sha256,
        "size_bytes": body.size_bytes,
        "filename": body.filename,
        "text": body.text,
    }
    query = Q["insert_document"] if request.new_version_of is None else Q["insert_document_version"]
    for _ in range(_VERSION_RACE_RETRIES):
        try:
            async with pool.connection() as conn:
                row = await (await conn.execute(query, params)).fetchone()
            break
        except psycopg.errors.UniqueViolation:
            # Two new versions of one document raced for the same number; take the next one.
            continue
    else:
        raise Conflict(
            "too many concurrent new versions of this document; retry", code="document_version_race"
        )
    if row is None:
        raise NotFound(
            f"there is no document {request.new_version_of} for this tenant", code="document_not_found"
        )
    return {
        "document_id": str(row["id"]),
        "version": row["version"],
        "sha256": row["sha256"],
        "size": row["size_bytes"],
        "filename": row["filename"],
    }


def prune_documents(pool: Any, retention_days: float, *, batch: int = 500) -> tuple[int, int]:
    """Delete one batch of documents no job references, older than the retention; returns how many
    and their bytes. ``pool`` is a blocking pool (the relay's)."""
    with pool.connection() as conn:
        rows = conn.execute(Q["prune_documents"], {"days": retention_days, "batch": batch}).fetchall()
    return len(rows), sum(int(r["size_bytes"]) for r in rows)
