"""Storing documents: immutable once written; a new version is a new row."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from services.acceptance.queries import Q
from services.acceptance.requests import CreateDocument
from services.common.api.errors import Conflict, NotFound
from services.common.api.tenancy import Tenant
from services.common.ids import new_id

JSON = dict[str, Any]

_VERSION_RACE_RETRIES = 5


async def store_document(pool: AsyncConnectionPool[Any], tenant: Tenant, request: CreateDocument) -> JSON:
    body = request.body
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
