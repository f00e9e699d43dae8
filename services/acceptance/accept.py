"""Accepting an extraction job (DESIGN §2 step 1, §5.1, §5.2).

The write is one atomic statement (writable CTEs): the inline document, the job row ``READY``, its
job event and its ``extraction.requested.v1`` outbox event, the last three only when the job row
itself was inserted, i.e. when no request with this idempotency key came first. It is the unit of
work in a single round trip; its event rows carry the same :class:`JobChange` parameters the unit
of work writes. Nothing else happens inside the request: no broker call, no model call.

Admission reads counters that are exact at the moment of reading. A worker keeps what it last read
for a fraction of a second and skips the read while a job fits comfortably within every limit (with
room for hundreds more); otherwise it takes the tenant's admission lock, reads afresh, decides and
writes in one transaction, so a cap holds exactly however many requests race for its last place.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from services.acceptance import admission, metrics, views
from services.acceptance.group_write import GroupWriter
from services.acceptance.idempotency import request_hash
from services.acceptance.queries import Q
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common import events, states, tracing
from services.common.api.errors import ApiError, Conflict, Unprocessable
from services.common.api.tenancy import Tenant
from services.common.db import statement_cursor
from services.common.ids import new_id
from services.common.uow import JobChange, OutboxNotifier

JSON = dict[str, Any]
# Written in the transaction that inserts a new job, with its id (the Kafka ingress's inbox row).
Within = Callable[[AsyncConnection[Any], uuid.UUID], Awaitable[None]]


@dataclass(frozen=True)
class Accepted:
    body: JSON
    replay: bool


@dataclass(frozen=True)
class Plan:
    """Everything about the new job that is known before it is written."""

    document_id: uuid.UUID
    document_version: int
    digest: str
    request_hash: str
    model_policy: str
    cost: admission.JobCost


class UsageCache:
    """The admission counters this worker last read, per tenant, with the jobs it accepted since."""

    def __init__(self, ttl_seconds: float) -> None:
        self._ttl = ttl_seconds
        self._entries: dict[uuid.UUID, tuple[float, admission.Usage]] = {}

    def recent(self, tenant_id: uuid.UUID) -> admission.Usage | None:
        entry = self._entries.get(tenant_id)
        if entry is None or time.monotonic() - entry[0] > self._ttl:
            return None
        return entry[1]

    def remember(self, tenant_id: uuid.UUID, usage: admission.Usage) -> None:
        if self._ttl > 0:
            self._entries[tenant_id] = (time.monotonic(), usage)

    def charge(self, tenant_id: uuid.UUID, cost: admission.JobCost, jobs: int = 1) -> None:
        """Count ``jobs`` more jobs of ``cost`` (-1 gives back a charge whose write did not happen)."""
        entry = self._entries.get(tenant_id)
        if entry is not None:
            u = entry[1]
            # Built directly: dataclasses.replace inspects the fields at every call.
            self._entries[tenant_id] = (
                entry[0],
                admission.Usage(
                    pending_jobs=u.pending_jobs + jobs,
                    pending_bytes=u.pending_bytes + jobs * cost.bytes,
                    pending_tokens=u.pending_tokens + jobs * cost.tokens,
                    tokens_today=u.tokens_today + jobs * cost.tokens,
                    system_pending_jobs=u.system_pending_jobs + jobs,
                ),
            )


class Acceptor:
    def __init__(
        self, pool: AsyncConnectionPool[Any], notifier: OutboxNotifier | None, settings: AcceptanceSettings
    ) -> None:
        self._pool = pool
        self._notifier = notifier
        self._settings = settings
        self._usage = UsageCache(settings.admission_cache_seconds)
        self._writer = GroupWriter(pool, writers=settings.accept_writers, max_group=settings.accept_group_max)
        # The counters read under way per tenant, which requests finding the cache stale share.
        self._reading: dict[uuid.UUID, asyncio.Task[admission.Usage]] = {}

    async def accept(
        self, tenant: Tenant, key: str, request: CreateJob, *, within: Within | None = None
    ) -> Accepted:
        """Accept the job, or answer as a replay of its key; ``within`` is written in the same
        transaction as a new job (a replay writes nothing, so it is not called)."""
        plan: Plan | None = None
        if isinstance(request.document, DocumentBody):
            plan = plan_job(
                self._settings, tenant.id, key, request, request.document.size_bytes, request.document.sha256
            )
            usage = await self._recent_usage(tenant.id)
            if usage is not None and self._comfortable(tenant, usage, plan.cost):
                # Far from every limit: a replay of this key is caught by the write itself. The job
                # is charged to this worker's view before the write, so requests deciding while it
                # is under way count it.
                self._usage.charge(tenant.id, plan.cost)
                try:
                    accepted = await self._write(tenant, key, request, plan, usage, within)
                except BaseException:
                    self._usage.charge(tenant.id, plan.cost, jobs=-1)
                    raise
                if accepted.replay:
                    self._usage.charge(tenant.id, plan.cost, jobs=-1)
                return accepted
        return await self._accept_after_reading(tenant, key, request, plan, within)

    async def _recent_usage(self, tenant_id: uuid.UUID) -> admission.Usage | None:
        """The tenant's admission counters as this worker read them at most the cache's lifetime
        ago (with the jobs it accepted since); None when the cache is off.

        When they are older, one read refreshes them and every request that finds them stale
        meanwhile waits for that read instead of making its own: under load, each made the careful
        path's read, one round trip more per job, for as long as the cache stayed stale.
        """
        usage = self._usage.recent(tenant_id)
        if usage is not None or self._settings.admission_cache_seconds <= 0:
            return usage
        reading = self._reading.get(tenant_id)
        if reading is None:
            reading = asyncio.get_running_loop().create_task(self._read_usage(tenant_id))
            self._reading[tenant_id] = reading
            reading.add_done_callback(lambda _: self._reading.pop(tenant_id, None))
        # Shielded: a request that goes away does not cancel the read others wait for.
        read = await asyncio.shield(reading)
        # Counting the jobs accepted since the read by requests that waited for it too.
        return self._usage.recent(tenant_id) or read

    async def _read_usage(self, tenant_id: uuid.UUID) -> admission.Usage:
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["admission_counters"], {"tenant_id": tenant_id})).fetchone()
        assert row is not None  # an aggregate query always returns one row
        usage = admission.Usage.of(row)
        self._usage.remember(tenant_id, usage)
        return usage

    async def _accept_after_reading(
        self, tenant: Tenant, key: str, request: CreateJob, plan: Plan | None, within: Within | None
    ) -> Accepted:
        """The careful path: under the tenant's admission lock, read the key's job, the document and
        the counters, decide, and write, in one transaction; so two requests near a limit cannot
        both take its last place."""
        ref_id = None if isinstance(request.document, DocumentBody) else request.document.document_id
        ref_version = 1 if isinstance(request.document, DocumentBody) else request.document.version
        async with self._pool.connection() as conn:
            async with conn.transaction():
                snapshot = await locked_snapshot(
                    conn, tenant.id, key=key, document_id=ref_id, document_version=ref_version
                )
                usage = admission.Usage.of(snapshot)
                self._usage.remember(tenant.id, usage)

                if plan is None:
                    stored = snapshot["document"]
                    if stored is None:
                        raise Unprocessable(
                            f"there is no document {ref_id} version {ref_version} for this tenant",
                            code="document_not_found",
                        )
                    plan = plan_job(
                        self._settings,
                        tenant.id,
                        key,
                        request,
                        int(stored["size_bytes"]),
                        str(stored["sha256"]),
                    )
                if snapshot["existing"] is not None:
                    existing = snapshot["existing"]
                    existing = {**existing, "id": uuid.UUID(existing["id"])}
                    return self._replay(existing, plan.request_hash, self._estimated_seconds(usage))
                rejection = admission.decide(
                    tenant.limits,
                    usage,
                    plan.cost,
                    max_system_backlog=self._settings.max_system_backlog,
                    now=datetime.now(UTC),
                    quota_retry_after=self._settings.admission_retry_after_seconds,
                    backlog_retry_after=self._settings.backlog_retry_after_seconds,
                )
                if rejection is not None:
                    metrics.ADMISSION_REJECTIONS.labels(rejection.limit).inc()
                    raise refusal(rejection)
                row = await self._insert(conn, tenant, key, request, plan, within)
            return await self._answer(conn, tenant, key, plan, usage, row, charge=True)

    def _comfortable(self, tenant: Tenant, usage: admission.Usage, cost: admission.JobCost) -> bool:
        return admission.comfortably_within(
            tenant.limits, usage, cost, max_system_backlog=self._settings.max_system_backlog
        )

    async def _write(
        self,
        tenant: Tenant,
        key: str,
        request: CreateJob,
        plan: Plan,
        usage: admission.Usage,
        within: Within | None,
    ) -> Accepted:
        """The fast path's write: the job in one statement, committed with the writes of other
        requests that queue meanwhile (``GroupWriter``); with ``within``, one transaction of its own."""
        if within is None:
            params = write_params(self._settings, tenant.id, key, request, plan, new_id())
            row = await self._writer.write(params)
            return await self._answer(None, tenant, key, plan, usage, row, charge=False)
        async with self._pool.connection() as conn:
            async with conn.transaction():
                row = await self._insert(conn, tenant, key, request, plan, within)
            return await self._answer(conn, tenant, key, plan, usage, row, charge=False)

    async def _insert(
        self,
        conn: AsyncConnection[Any],
        tenant: Tenant,
        key: str,
        request: CreateJob,
        plan: Plan,
        within: Within | None,
    ) -> JSON | None:
        """``accept_job``: the new job's row, or None when the key was taken first."""
        params = write_params(self._settings, tenant.id, key, request, plan, new_id())
        cursor = statement_cursor(conn, "accept_job")
        row = await (await cursor.execute(Q["accept_job"], params)).fetchone()
        if row is not None and within is not None:
            await within(conn, row["id"])
        return row

    async def _answer(
        self,
        conn: AsyncConnection[Any] | None,
        tenant: Tenant,
        key: str,
        plan: Plan,
        usage: admission.Usage,
        row: JSON | None,
        *,
        charge: bool,
    ) -> Accepted:
        """The answer once the write has committed: the new job, or the replay of the job that
        holds the key (read on ``conn``, or on a connection of the pool without one)."""
        estimated = self._estimated_seconds(usage)
        if row is None:
            # The key was taken first (now, or by an earlier request): answer as its replay.
            existing = await self._job_by_key(conn, tenant.id, key)
            if existing is None:  # the other request rolled back after all; the client may retry
                raise Conflict(
                    "a concurrent request with the same Idempotency-Key did not complete; retry",
                    code="idempotency_key_in_flight",
                )
            return self._replay(existing, plan.request_hash, estimated)
        if charge:
            self._usage.charge(tenant.id, plan.cost)
        if self._notifier is not None:
            self._notifier.poke()
        metrics.JOBS_ACCEPTED.labels(row["priority"]).inc()
        return Accepted(views.accepted_body(row, estimated_seconds=estimated, replay=False), replay=False)

    async def _job_by_key(
        self, conn: AsyncConnection[Any] | None, tenant_id: uuid.UUID, key: str
    ) -> JSON | None:
        if conn is None:
            async with self._pool.connection() as conn:
                return await self._job_by_key(conn, tenant_id, key)
        params = {"tenant_id": tenant_id, "idempotency_key": key}
        return await (await conn.execute(Q["job_by_key"], params)).fetchone()

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

    def _estimated_seconds(self, usage: admission.Usage) -> int:
        return math.ceil(20 + usage.pending_jobs / self._settings.expected_jobs_per_second)


async def locked_snapshot(
    conn: AsyncConnection[Any],
    tenant_id: uuid.UUID,
    *,
    key: str | None = None,
    document_id: uuid.UUID | None = None,
    document_version: int = 1,
) -> JSON:
    """Take the tenant's admission lock (to the end of ``conn``'s transaction) and read
    ``admission_snapshot``: what a decision on fresh counters needs."""
    await conn.execute(Q["admission_lock"], {"tenant_id": tenant_id})
    snapshot = await (
        await conn.execute(
            Q["admission_snapshot"],
            {
                "tenant_id": tenant_id,
                "idempotency_key": key,
                "document_id": document_id,
                "document_version": document_version,
            },
        )
    ).fetchone()
    assert snapshot is not None  # an aggregate query always returns one row
    return dict(snapshot)


def plan_job(
    settings: AcceptanceSettings, tenant_id: uuid.UUID, key: str, request: CreateJob, size: int, digest: str
) -> Plan:
    """The new job's document identity, request hash and admission cost. Pure."""
    if isinstance(request.document, DocumentBody):
        # The id of an inline document is derived from the key, so a replay writes nothing.
        document_id, version, document_key = uuid.uuid5(tenant_id, f"inline:{key}"), 1, "inline"
    else:
        document_id, version = request.document.document_id, request.document.version
        document_key = f"{document_id}@{version}"
    model_policy = str(request.options.get("model_policy", settings.model_policy))
    return Plan(
        document_id=document_id,
        document_version=version,
        digest=digest,
        request_hash=request_hash(
            document_key=document_key,
            object_version=digest,
            schema=request.schema,
            model_policy=model_policy,
            policy_version=settings.policy_version,
            options=request.options,
        ),
        model_policy=model_policy,
        cost=admission.JobCost(
            bytes=size,
            tokens=admission.estimate_tokens(
                size, prompt_overhead=settings.prompt_overhead_tokens, max_output=settings.max_output_tokens
            ),
        ),
    )


def write_params(
    settings: AcceptanceSettings,
    tenant_id: uuid.UUID,
    key: str,
    request: CreateJob,
    plan: Plan,
    job_id: uuid.UUID,
    *,
    batch_id: uuid.UUID | None = None,
    batch_index: int | None = None,
) -> dict[str, Any]:
    """Parameters of ``accept_job``: the job row plus the JobChange the unit of work would record;
    for an item of a batch, the batch and the item's index in it."""
    change = JobChange(
        tenant_id=tenant_id,
        job_id=job_id,
        state=states.READY,
        state_version=1,
        event_type=events.EXTRACTION_REQUESTED,
        traceparent=tracing.current_traceparent(),
    )
    inline = request.document if isinstance(request.document, DocumentBody) else None
    return {
        **change.params(),
        "inline": inline is not None,
        "document_id": plan.document_id,
        "document_version": plan.document_version,
        "sha256": plan.digest,
        "size_bytes": plan.cost.bytes,
        "filename": inline.filename if inline else None,
        "text": inline.text if inline else None,
        "idempotency_key": key,
        "request_hash": plan.request_hash,
        "estimated_tokens": plan.cost.tokens,
        "schema_version": request.schema,
        "policy_version": settings.policy_version,
        "model_policy": plan.model_policy,
        "options": Jsonb(request.options),
        "priority": request.priority,
        "deadline_seconds": request.deadline_seconds,
        "batch_id": batch_id,
        "batch_index": batch_index,
    }


def refusal(rejection: admission.Rejection) -> ApiError:
    return ApiError(
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
