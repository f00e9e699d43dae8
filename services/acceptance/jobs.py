"""Reading, listing and cancelling extraction jobs: the work behind those HTTP routes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from psycopg_pool import AsyncConnectionPool

from services.acceptance import metrics, views
from services.acceptance.queries import Q
from services.common import events, sli, states
from services.common.api.cursor import decode_cursor, encode_cursor
from services.common.api.errors import Conflict, NotFound
from services.common.api.tenancy import Tenant
from services.common.uow import JobChange, OutboxNotifier, async_unit_of_work

JSON = dict[str, Any]

_FIRST_PAGE = (datetime.max.replace(tzinfo=UTC), uuid.UUID(int=(1 << 128) - 1))


class JobService:
    def __init__(self, pool: AsyncConnectionPool[Any], notifier: OutboxNotifier | None) -> None:
        self._pool = pool
        self._notifier = notifier

    async def get(self, tenant: Tenant, job_id: uuid.UUID | None) -> JSON:
        if job_id is None:
            raise _job_not_found()
        async with self._pool.connection() as conn:
            row = await (
                await conn.execute(Q["get_job"], {"job_id": job_id, "tenant_id": tenant.id})
            ).fetchone()
        if row is None:
            raise _job_not_found()
        return views.status_body(row)

    async def list(self, tenant: Tenant, *, state: str | None, cursor: str | None, limit: int) -> JSON:
        before_created, before_id = decode_cursor(cursor) if cursor else _FIRST_PAGE
        params = {
            "tenant_id": tenant.id,
            "state": state,
            "before_created_at": before_created,
            "before_id": before_id,
            "limit": limit + 1,
        }
        query = Q["list_jobs_in_state"] if state else Q["list_jobs"]
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(query, params)).fetchall()
        page, more = rows[:limit], len(rows) > limit
        next_cursor = encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more and page else None
        return {"jobs": [views.summary_body(r) for r in page], "next_cursor": next_cursor}

    async def cancel(self, tenant: Tenant, job_id: uuid.UUID | None) -> JSON:
        if job_id is None:
            raise _job_not_found()
        params = {"job_id": job_id, "tenant_id": tenant.id}
        async with async_unit_of_work(self._pool, self._notifier) as uow:
            row = await (await uow.execute(Q["cancel_job"], params)).fetchone()
            if row is not None:
                await uow.record(
                    JobChange(
                        tenant_id=tenant.id,
                        job_id=job_id,
                        state=states.CANCELLED,
                        state_version=row["state_version"],
                        event_type=events.EXTRACTION_CANCELLED,
                    )
                )
        current = await self.get(tenant, job_id)
        if row is None and current["state"] != states.CANCELLED:
            raise Conflict(
                f"job {job_id} has already finished in state {current['state']} and cannot be cancelled",
                code="job_already_finished",
                details={"job_id": str(job_id), "state": current["state"]},
            )
        if row is not None:
            metrics.JOBS_CANCELLED.inc()
            sli.observe_completion(row["priority"], states.CANCELLED, row["since_accepted"])
        return current


def _job_not_found() -> NotFound:
    return NotFound("no such extraction job for this tenant", code="job_not_found")
