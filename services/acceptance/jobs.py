"""Accepting, reading, listing and cancelling extraction jobs: the work behind the HTTP routes.

Acceptance is one short transaction: the job row ``READY``, its job event and its
``extraction.requested.v1`` outbox event commit together (DESIGN §2 step 1). Nothing else happens
inside the request: no broker call, no model call.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from services.acceptance import admission, metrics, views
from services.acceptance.errors import ApiError, Conflict, NotFound, Unprocessable
from services.acceptance.idempotency import request_hash
from services.acceptance.queries import Q
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import Tenant
from services.common import events, states
from services.common.ids import new_id
from services.common.uow import JobChange, OutboxNotifier, async_unit_of_work

JSON = dict[str, Any]

_FIRST_PAGE = (datetime.max.replace(tzinfo=UTC), uuid.UUID(int=(1 << 128) - 1))


@dataclass(frozen=True)
class Accepted:
    body: JSON
    replay: bool


class _KeyTaken(Exception):
    """Another request holding the same idempotency key committed first."""


class JobService:
    def __init__(
        self, pool: AsyncConnectionPool[Any], notifier: OutboxNotifier | None, settings: AcceptanceSettings
    ) -> None:
        self._pool = pool
        self._notifier = notifier
        self._settings = settings

    async def accept(self, tenant: Tenant, key: str, request: CreateJob) -> Accepted:
        s = self._settings
        inline = isinstance(request.document, DocumentBody)
        if isinstance(request.document, DocumentBody):
            document_id = uuid.uuid5(tenant.id, f"inline:{key}")
            document_version = 1
        else:
            document_id = request.document.document_id
            document_version = request.document.version

        async with self._pool.connection() as conn:
            snapshot = await (
                await conn.execute(
                    Q["admission_snapshot"],
                    {
                        "tenant_id": tenant.id,
                        "idempotency_key": key,
                        "document_id": None if inline else document_id,
                        "document_version": document_version,
                    },
                )
            ).fetchone()
        assert snapshot is not None  # an aggregate query always returns one row

        if isinstance(request.document, DocumentBody):
            size, digest = request.document.size_bytes, request.document.sha256
            document_key = "inline"
        else:
            stored = snapshot["document"]
            if stored is None:
                raise Unprocessable(
                    f"there is no document {document_id} version {document_version} for this tenant",
                    code="document_not_found",
                )
            size, digest = int(stored["size_bytes"]), str(stored["sha256"])
            document_key = f"{document_id}@{document_version}"

        model_policy = str(request.options.get("model_policy", s.model_policy))
        wanted_hash = request_hash(
            document_key=document_key,
            object_version=digest,
            schema=request.schema,
            model_policy=model_policy,
            policy_version=s.policy_version,
            options=request.options,
        )
        usage = admission.Usage(
            pending_jobs=snapshot["pending_jobs"],
            pending_bytes=snapshot["pending_bytes"],
            pending_tokens=snapshot["pending_tokens"],
            tokens_today=snapshot["tokens_today"],
            system_pending_jobs=snapshot["system_pending_jobs"],
        )
        estimated = self._estimated_seconds(usage.pending_jobs)
        if snapshot["existing"] is not None:
            return self._replay(_decode_job(snapshot["existing"]), wanted_hash, estimated)

        cost = admission.JobCost(
            bytes=size,
            tokens=admission.estimate_tokens(
                size, prompt_overhead=s.prompt_overhead_tokens, max_output=s.max_output_tokens
            ),
        )
        rejection = admission.decide(
            tenant.limits,
            usage,
            cost,
            max_system_backlog=s.max_system_backlog,
            now=datetime.now(UTC),
            quota_retry_after=s.admission_retry_after_seconds,
            backlog_retry_after=s.backlog_retry_after_seconds,
        )
        if rejection is not None:
            metrics.ADMISSION_REJECTIONS.labels(rejection.limit).inc()
            raise ApiError(
                rejection.message,
                status=rejection.status,
                code="system_backlog_full" if rejection.status == 503 else "tenant_quota_exceeded",
                headers={"Retry-After": str(rejection.retry_after_seconds)},
                details={
                    "limit": rejection.limit,
                    "current": rejection.current,
                    "maximum": rejection.maximum,
                    "retry_after_seconds": rejection.retry_after_seconds,
                },
            )

        job_id = new_id()
        try:
            async with async_unit_of_work(self._pool, self._notifier) as uow:
                if isinstance(request.document, DocumentBody):
                    await uow.execute(
                        Q["insert_inline_document"],
                        {
                            "tenant_id": tenant.id,
                            "document_id": document_id,
                            "sha256": digest,
                            "size_bytes": size,
                            "filename": request.document.filename,
                            "text": request.document.text,
                        },
                    )
                row = await (
                    await uow.execute(
                        Q["insert_job"],
                        {
                            "id": job_id,
                            "tenant_id": tenant.id,
                            "idempotency_key": key,
                            "request_hash": wanted_hash,
                            "document_id": document_id,
                            "document_version": document_version,
                            "object_version": digest,
                            "doc_bytes": size,
                            "estimated_tokens": cost.tokens,
                            "schema_version": request.schema,
                            "policy_version": s.policy_version,
                            "model_policy": model_policy,
                            "options": Jsonb(request.options),
                            "priority": request.priority,
                            "deadline_seconds": request.deadline_seconds,
                        },
                    )
                ).fetchone()
                if row is None:
                    raise _KeyTaken
                await uow.record(
                    JobChange(
                        tenant_id=tenant.id,
                        job_id=job_id,
                        state=states.READY,
                        state_version=1,
                        event_type=events.EXTRACTION_REQUESTED,
                    )
                )
        except _KeyTaken:
            # Lost the race to a concurrent request with the same key: answer as a replay of it.
            async with self._pool.connection() as conn:
                existing = await (
                    await conn.execute(Q["job_by_key"], {"tenant_id": tenant.id, "idempotency_key": key})
                ).fetchone()
            if existing is None:  # the winner rolled back after all; the client may simply retry
                raise ApiError(
                    "a concurrent request with the same Idempotency-Key did not complete; retry",
                    status=409,
                    code="idempotency_key_in_flight",
                ) from None
            return self._replay(existing, wanted_hash, estimated)
        metrics.JOBS_ACCEPTED.labels(request.priority).inc()
        return Accepted(views.accepted_body(row, estimated_seconds=estimated, replay=False), replay=False)

    def _replay(self, existing: JSON, wanted_hash: str, estimated: int) -> Accepted:
        if existing["request_hash"] != wanted_hash:
            metrics.IDEMPOTENCY_CONFLICTS.inc()
            raise Conflict(
                f"this Idempotency-Key was already used for job {existing['id']} with a different request; "
                "use a new key for a different request",
                code="idempotency_key_reused",
                details={"job_id": str(existing["id"]), "status_url": views.status_url(existing["id"])},
            )
        metrics.IDEMPOTENT_REPLAYS.inc()
        return Accepted(views.accepted_body(existing, estimated_seconds=estimated, replay=True), replay=True)

    def _estimated_seconds(self, tenant_pending_jobs: int) -> int:
        s = self._settings
        return math.ceil(20 + tenant_pending_jobs / s.expected_jobs_per_second)

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
        before_created, before_id = _decode_cursor(cursor) if cursor else _FIRST_PAGE
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
        next_cursor = _encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more and page else None
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
        return current


def _job_not_found() -> NotFound:
    return NotFound("no such extraction job for this tenant", code="job_not_found")


def _decode_job(raw: JSON) -> JSON:
    return {**raw, "id": uuid.UUID(raw["id"]), "created_at": datetime.fromisoformat(raw["created_at"])}


def _encode_cursor(created_at: datetime, job_id: uuid.UUID) -> str:
    raw = json.dumps({"c": created_at.isoformat(), "i": str(job_id)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        created_at = datetime.fromisoformat(raw["c"])
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, uuid.UUID(raw["i"])
    except (ValueError, KeyError, TypeError, UnicodeEncodeError, binascii.Error):
        raise ApiError("the cursor is not one this server issued", code="invalid_cursor") from None
