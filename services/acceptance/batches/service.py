"""Accepting and reading extraction batches, independent of the transport (HTTP routes, gRPC).

Accepting a batch is the single job's acceptance once per item: the same plan (``plan_job``), the
same admission decision made once for the batch's total (all or nothing), and the same statement
(``accept_job``: job, inline document, job event, outbox event), sent in one pipelined round trip
per chunk, each chunk in one transaction. A request interrupted between chunks leaves a batch that
says so (``accepting``); the same request again writes only what is missing, since every item's
key is derived from the batch's key and an item already written is recognised by it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from services.acceptance import admission, metrics
from services.acceptance.accept import Plan, locked_snapshot, plan_job, refusal, write_params
from services.acceptance.batches import views
from services.acceptance.batches.requests import CreateBatch, item_keys
from services.acceptance.queries import Q as ACCEPT_Q
from services.acceptance.requests import DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common.api.errors import ApiError, Conflict, NotFound, Unprocessable
from services.common.api.tenancy import Tenant
from services.common.ids import new_id
from services.common.queries import load_queries
from services.common.uow import OutboxNotifier

JSON = dict[str, Any]
Q = load_queries(Path(__file__).with_name("sql") / "batches.sql")

# Items per transaction: large enough that a round trip carries many, small enough that a
# transaction stays short (measured: tests/integration/test_batches.py prints the 10,000-item time).
CHUNK_ITEMS = 500


@dataclass(frozen=True)
class BatchAccepted:
    body: JSON
    replay: bool


class BatchService:
    def __init__(
        self,
        pool: AsyncConnectionPool[Any],
        notifier: OutboxNotifier | None,
        settings: AcceptanceSettings,
        *,
        chunk_items: int = CHUNK_ITEMS,
    ) -> None:
        self._pool = pool
        self._notifier = notifier
        self._settings = settings
        self._chunk = chunk_items

    async def submit(self, tenant: Tenant, key: str, batch: CreateBatch) -> BatchAccepted:
        """Accept every item of ``batch`` under the batch key ``key``, or none: 202's body, or a
        typed error (409 a key reused with another request, 422 a missing document, 429/503
        admission) with nothing written."""
        keys = item_keys(key, batch)
        async with self._pool.connection() as conn:
            existing = await (
                await conn.execute(Q["batch_by_key"], {"tenant_id": tenant.id, "idempotency_key": key})
            ).fetchone()
            snapshot = await (
                await conn.execute(
                    ACCEPT_Q["admission_snapshot"],
                    # No key and no document: only the counters.
                    {
                        "tenant_id": tenant.id,
                        "idempotency_key": None,
                        "document_id": None,
                        "document_version": 1,
                    },
                )
            ).fetchone()
            stored = await self._documents(conn, tenant, batch)
        assert snapshot is not None  # an aggregate query always returns one row
        plans = await asyncio.to_thread(self._plans, tenant, keys, batch, stored)
        request_hash = batch_hash(keys, plans)
        estimated = views.estimated_seconds(
            snapshot["pending_jobs"], len(keys), self._settings.expected_jobs_per_second
        )
        if existing is not None:
            _same_request(existing, request_hash)
            if existing["state"] != "accepting":
                metrics.IDEMPOTENT_REPLAYS.inc()
                return await self._answer(tenant, existing["id"], estimated, replay=True)
        else:
            self._admit(tenant, snapshot, plans)
        batch_id, created = await self._write(tenant, key, batch, keys, plans, request_hash)
        if created:
            metrics.BATCHES_ACCEPTED.labels(batch.priority).inc()
        else:
            metrics.IDEMPOTENT_REPLAYS.inc()
        return await self._answer(tenant, batch_id, estimated, replay=not created)

    async def get(self, tenant: Tenant, batch_id: uuid.UUID | None) -> JSON:
        row = await self._batch(tenant, batch_id)
        return views.status_body(row, self._settings.expected_jobs_per_second)

    async def items(
        self, tenant: Tenant, batch_id: uuid.UUID | None, *, state: str | None, cursor: str | None, limit: int
    ) -> JSON:
        """A page of the batch's items in index order, readable while the batch runs; ``state`` is a
        job state or ``errors`` (every item that ended without a result)."""
        row = await self._batch(tenant, batch_id)
        params: JSON = {
            "batch_id": row["id"],
            "tenant_id": tenant.id,
            "after": decode_cursor(cursor) if cursor else -1,
            "limit": limit + 1,
        }
        query = Q["batch_items"]
        if state is not None:
            params["states"] = list(views.ERROR_STATES) if state == views.ERRORS else [state]
            query = Q["batch_items_in_states"]
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(query, params)).fetchall()
        page, more = rows[:limit], len(rows) > limit
        return {
            "batch_id": str(row["id"]),
            "items": [views.item_body(r) for r in page],
            "next_cursor": encode_cursor(page[-1]["batch_index"]) if more and page else None,
        }

    async def _batch(self, tenant: Tenant, batch_id: uuid.UUID | None) -> JSON:
        row = None
        if batch_id is not None:
            async with self._pool.connection() as conn:
                row = await (
                    await conn.execute(Q["get_batch"], {"batch_id": batch_id, "tenant_id": tenant.id})
                ).fetchone()
        if row is None:
            raise NotFound("no such extraction batch for this tenant", code="batch_not_found")
        return dict(row)

    async def _answer(
        self, tenant: Tenant, batch_id: uuid.UUID, estimated: int, *, replay: bool
    ) -> BatchAccepted:
        row = await self._batch(tenant, batch_id)
        body = views.accepted_body(
            row,
            estimated_seconds=estimated,
            replay=replay,
            expected_jobs_per_second=self._settings.expected_jobs_per_second,
        )
        return BatchAccepted(body, replay)

    async def _documents(
        self, conn: AsyncConnection[Any], tenant: Tenant, batch: CreateBatch
    ) -> dict[tuple[uuid.UUID, int], JSON]:
        """The size and digest of every document the items name by id, in one query."""
        refs = {
            (item.job.document.document_id, item.job.document.version)
            for item in batch.items
            if not isinstance(item.job.document, DocumentBody)
        }
        if not refs:
            return {}
        params = {
            "tenant_id": tenant.id,
            "ids": [r[0] for r in refs],
            "versions": [r[1] for r in refs],
        }
        rows = await (await conn.execute(Q["documents_by_ref"], params)).fetchall()
        return {(r["id"], r["version"]): r for r in rows}

    def _plans(
        self, tenant: Tenant, keys: list[str], batch: CreateBatch, stored: dict[tuple[uuid.UUID, int], JSON]
    ) -> list[Plan]:
        plans = []
        for index, (key, item) in enumerate(zip(keys, batch.items, strict=True)):
            document = item.job.document
            if isinstance(document, DocumentBody):
                size, digest = document.size_bytes, document.sha256
            else:
                found = stored.get((document.document_id, document.version))
                if found is None:
                    raise Unprocessable(
                        f"item {index}: there is no document {document.document_id} version "
                        f"{document.version} for this tenant; nothing was accepted",
                        code="document_not_found",
                        details={"index": index},
                    )
                size, digest = int(found["size_bytes"]), str(found["sha256"])
            plans.append(plan_job(self._settings, tenant.id, key, item.job, size, digest))
        return plans

    def _admit(self, tenant: Tenant, snapshot: JSON, plans: list[Plan]) -> None:
        """The single job's admission decision, for the whole batch at once."""
        usage = admission.Usage.of(snapshot)
        cost = admission.JobCost(
            bytes=sum(p.cost.bytes for p in plans), tokens=sum(p.cost.tokens for p in plans)
        )
        rejection = admission.decide(
            tenant.limits,
            usage,
            cost,
            max_system_backlog=self._settings.max_system_backlog,
            now=datetime.now(UTC),
            quota_retry_after=self._settings.admission_retry_after_seconds,
            backlog_retry_after=self._settings.backlog_retry_after_seconds,
            jobs=len(plans),
        )
        if rejection is not None:
            metrics.ADMISSION_REJECTIONS.labels(rejection.limit).inc(len(plans))
            error = refusal(rejection)
            raise ApiError(
                f"The batch of {len(plans)} items was refused as a whole; none of its items was "
                f"accepted. {error.message}",
                status=error.status,
                code=error.code,
                headers=error.headers,
                details={**error.details, "items": len(plans)},
            )

    async def _write(
        self,
        tenant: Tenant,
        key: str,
        batch: CreateBatch,
        keys: list[str],
        plans: list[Plan],
        request_hash: str,
    ) -> tuple[uuid.UUID, bool]:
        """Write the batch row and every item not written yet, one transaction per chunk; the first
        one also checks every key, so a conflict leaves nothing behind. Returns the batch's id and
        whether this request created it."""
        async with self._pool.connection() as conn:
            async with conn.transaction():
                batch_id = new_id()
                inserted = await (
                    await conn.execute(
                        Q["insert_batch"],
                        {
                            "batch_id": batch_id,
                            "tenant_id": tenant.id,
                            "idempotency_key": key,
                            "request_hash": request_hash,
                            "total": len(keys),
                            "priority": batch.priority,
                        },
                    )
                ).fetchone()
                created = inserted is not None
                if created:
                    # Decided again under the tenant's admission lock, on counters read now: two
                    # batches (or a batch and single jobs) racing for a tenant's last places cannot
                    # both take them. Items of later chunks count once their chunk commits.
                    snapshot = await locked_snapshot(conn, tenant.id)
                    self._admit(tenant, snapshot, plans)
                if not created:
                    # The same key came first (an earlier, interrupted request, or one racing this one).
                    existing = await (
                        await conn.execute(
                            Q["batch_by_key"], {"tenant_id": tenant.id, "idempotency_key": key}
                        )
                    ).fetchone()
                    assert existing is not None  # the insert conflicted with it, and batches stay
                    _same_request(existing, request_hash)
                    batch_id = existing["id"]
                taken = await _jobs_by_keys(conn, tenant, keys)
                todo = [i for i, k in enumerate(keys) if not _written(taken.get(k), batch_id, i, plans[i])]
                chunks = [todo[i : i + self._chunk] for i in range(0, len(todo), self._chunk)] or [[]]
                await self._write_chunk(conn, tenant, batch, batch_id, keys, plans, chunks[0])
            for chunk in chunks[1:]:
                async with conn.transaction():
                    await self._write_chunk(conn, tenant, batch, batch_id, keys, plans, chunk)
        if self._notifier is not None:
            self._notifier.poke()
        return batch_id, created

    async def _write_chunk(
        self,
        conn: AsyncConnection[Any],
        tenant: Tenant,
        batch: CreateBatch,
        batch_id: uuid.UUID,
        keys: list[str],
        plans: list[Plan],
        chunk: list[int],
    ) -> None:
        """``accept_job`` for each item of ``chunk``, pipelined, inside the caller's transaction."""
        missed: list[int] = []
        if chunk:
            params = [
                write_params(
                    self._settings,
                    tenant.id,
                    keys[i],
                    batch.items[i].job,
                    plans[i],
                    new_id(),
                    batch_id=batch_id,
                    batch_index=i,
                )
                for i in chunk
            ]
            async with conn.cursor() as cur:
                await cur.executemany(ACCEPT_Q["accept_job"], params, returning=True)
                for i in chunk:
                    if await cur.fetchone() is None:
                        missed.append(i)
                    cur.nextset()
        if missed:
            # Taken since the check: by a request racing this one for the same batch (fine), or by
            # another request with the key (a conflict: this chunk rolls back).
            taken = await _jobs_by_keys(conn, tenant, [keys[i] for i in missed])
            for i in missed:
                if not _written(taken.get(keys[i]), batch_id, i, plans[i]):
                    raise Conflict(
                        f"item {i}'s key {keys[i]!r} was taken by a concurrent request; retry the batch",
                        code="idempotency_key_in_flight",
                        details={"index": i},
                    )
        written = len(chunk) - len(missed)
        await conn.execute(Q["items_written"], {"batch_id": batch_id, "written": written})
        metrics.JOBS_ACCEPTED.labels(batch.priority).inc(written)


def batch_hash(keys: list[str], plans: list[Plan]) -> str:
    """What the batch asks for: every item's key and request hash, in order."""
    items = [[k, p.request_hash] for k, p in zip(keys, plans, strict=True)]
    canonical = json.dumps(items, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _same_request(existing: JSON, request_hash: str) -> None:
    if existing["request_hash"] != request_hash:
        metrics.IDEMPOTENCY_CONFLICTS.inc()
        raise Conflict(
            f"this Idempotency-Key was already used for batch {existing['id']} with a different request; "
            "use a new key for a different batch",
            code="idempotency_key_reused",
            details={"batch_id": str(existing["id"]), "status_url": views.status_url(existing["id"])},
        )


async def _jobs_by_keys(conn: AsyncConnection[Any], tenant: Tenant, keys: list[str]) -> dict[str, JSON]:
    rows = await (await conn.execute(Q["jobs_by_keys"], {"tenant_id": tenant.id, "keys": keys})).fetchall()
    return {r["idempotency_key"]: r for r in rows}


def _written(job: JSON | None, batch_id: uuid.UUID, index: int, plan: Plan) -> bool:
    """False when the item's key is free; True when this very item holds it; else a conflict."""
    if job is None:
        return False
    same_item = job["batch_id"] == batch_id and job["batch_index"] == index
    if same_item and job["request_hash"] == plan.request_hash:
        return True
    metrics.IDEMPOTENCY_CONFLICTS.inc()
    where = "outside any batch" if job["batch_id"] is None else f"in batch {job['batch_id']}"
    raise Conflict(
        f"item {index}'s idempotency key {job['idempotency_key']!r} already belongs to job {job['id']} "
        f"({where}) with a different request; nothing was accepted. Give the item a key of its own.",
        code="idempotency_key_reused",
        details={"index": index, "job_id": str(job["id"]), "status_url": f"/v1/extraction-jobs/{job['id']}"},
    )


def encode_cursor(index: int) -> str:
    return base64.urlsafe_b64encode(f"i:{index}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode((cursor + "=" * (-len(cursor) % 4)).encode("ascii")).decode("ascii")
        kind, _, value = raw.partition(":")
        if kind != "i" or not (value.isascii() and value.isdigit()) or len(value) > 9:
            raise ValueError("not a cursor of ours")
        return int(value)
    except (ValueError, UnicodeError, binascii.Error):
        raise ApiError("the cursor is not one this server issued", code="invalid_cursor") from None
