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
from services.common.api.tenancy import Tenant, tenant_from_row


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
        tenant = None if row is None else tenant_from_row(row)
        if self._ttl > 0:
            if len(self._entries) > 10_000:
                self._entries.clear()
            self._entries[tenant_id] = (time.monotonic(), tenant)
        return tenant
