"""The tenant a Kafka record names, with its admission limits, remembered for a few seconds.

Over HTTP the API key finds the tenant; a record names it, so the ingress looks it up by id. A
tenant created or changed meanwhile is seen within ``ttl`` seconds, as the edge's key cache is.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from psycopg_pool import AsyncConnectionPool

from services.acceptance.kafka.queries import Q
from services.common.api.tenancy import Tenant, TenantLimits


class TenantCache:
    def __init__(self, pool: AsyncConnectionPool[Any], ttl_seconds: float) -> None:
        self._pool = pool
        self._ttl = ttl_seconds
        self._entries: dict[uuid.UUID, tuple[float, Tenant | None]] = {}

    async def get(self, tenant_id: uuid.UUID) -> Tenant | None:
        entry = self._entries.get(tenant_id)
        if entry is not None and time.monotonic() - entry[0] <= self._ttl:
            return entry[1]
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["tenant"], {"tenant_id": tenant_id})).fetchone()
        tenant = None if row is None else _tenant(row)
        if self._ttl > 0:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[tenant_id] = (time.monotonic(), tenant)
        return tenant


def _tenant(row: dict[str, Any]) -> Tenant:
    return Tenant(
        id=row["id"],
        name=row["name"],
        weight=row["weight"],
        max_in_flight=row["max_in_flight"],
        limits=TenantLimits(
            max_pending_jobs=row["max_pending_jobs"],
            max_pending_bytes=row["max_pending_bytes"],
            max_pending_tokens=row["max_pending_tokens"],
            daily_token_budget=row["daily_token_budget"],
            max_stored_bytes=row["max_stored_bytes"],
        ),
        allowed_currencies=tuple(row["allowed_currencies"]),
    )
