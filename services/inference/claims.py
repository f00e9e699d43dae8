"""Claims and completions: the short, fenced transactions through which a worker owns a job.

A claim picks the next job by the fair-share choice, asks the limiter for a permit for it, and in
the same short transaction either starts it (``RUNNING``, attempt + 1, fence + 1, a lease, and the
document and master data its attempt reads) or defers it (``available_at`` moved by the limiter's
retry-after: not an attempt). The limiter call is bounded by the client's deadline; no provider
call ever happens inside a transaction. A completion that writes an outbox event wakes the relay
through the worker's nudge (services/inference/nudge.py): a NOTIFY in its own transaction at most
once per window, never a NOTIFY transaction per completion.

A completion is conditional on ``state = 'RUNNING' AND fence = :fence AND lease_until > now()``.
Zero rows updated means ownership was lost: the result is discarded, the job is not touched, and
the attempt is still logged with outcome ``stale`` because the provider call was made.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from services.common import events, sli, states, tracing
from services.common.ids import new_id
from services.common.queries import load_queries
from services.common.uow import JobChange, UnitOfWork, unit_of_work, versioned_change_ctes
from services.inference import metrics
from services.inference.fairness import TenantLoad, order_tenants, prefer
from services.inference.loads import KeptLoads
from services.inference.providers.base import Hop
from services.inference.suppliers import SupplierCache, Suppliers
from services.inference.validation import MasterSupplier, ValidationContext, normalize_tax_id
from services.limiter import Denial, Grant, NeverAdmittable

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "inference.sql")
# A start records its RUNNING event (history only: no outbox event) and a completion its change
# (job and outbox event) in the statement that writes the row (services/common/uow.py).
Q["start_job"] = Q["start_job"].replace(
    "{change_ctes}", versioned_change_ctes("started", outbox=False, detail="detail")
)
_COMPLETE_JOB = Q["complete_job"].replace("{change_ctes}", versioned_change_ctes("done"))
Q["complete_job"] = _COMPLETE_JOB.replace("{next_head}", "").replace("{returning}", "SELECT * FROM done")
# The completion and, in the same statement, the head job its slot's next claim tries first (one
# round trip per job less): ``head_job`` for the tenant and priority in ``next_head_*``. It always
# returns one row: the completion's columns (null when the fence was stale) and the head's, each
# prefixed ``head_`` (null when no job of that tenant and priority is due and free).
#
# The head is locked first, before the completion's UPDATE, which can wait on its own row. A
# ``FOR UPDATE SKIP LOCKED`` scan that meets a job another slot started after the statement's
# snapshot was taken follows the row to its newest version, locks it, finds it no longer due and
# skips it, but keeps that lock until the transaction ends; and this transaction goes on across the
# next claim's limiter call. Scanned after a wait, the head made such locks on running jobs, and
# their own slots' completions queued behind them (pg_stat_statements in `fatura bench pipeline`:
# 17 ms per completion, against 4.7 ms with the head first).
_HEAD_COLUMNS = (
    "id",
    "available_at",
    "estimated_tokens",
    "traceparent",
    "fence",
    "interactive_next",
    "batch_next",
)
_NEXT_HEAD = (
    Q["head_job"]
    .replace("%(tenant_id)s", "%(next_head_tenant_id)s")
    .replace("%(priority)s", "%(next_head_priority)s")
)
Q["complete_job_then_head"] = _COMPLETE_JOB.replace(
    "{next_head}", f",\nnext_head AS (\n{_NEXT_HEAD}\n)"
).replace(
    "{returning}",
    "SELECT done.*, "
    + ", ".join(f"next_head.{c} AS head_{c}" for c in _HEAD_COLUMNS)
    + "\nFROM (SELECT) AS one LEFT JOIN next_head ON true LEFT JOIN done ON true",
)

EVENT_FOR_STATE: dict[str, str | None] = {
    states.SUCCEEDED: events.EXTRACTION_COMPLETED,
    states.REVIEW_REQUIRED: events.REVIEW_REQUESTED,
    states.FAILED_TERMINAL: events.EXTRACTION_FAILED,
    states.RETRY_SCHEDULED: None,
}

# Asks the limiter for a permit for (tenant, estimated input tokens, request_key); may raise
# ``NeverAdmittable``. The key names the job and the fence its start takes (``request_key``).
Acquire = Callable[[uuid.UUID, int, str], Grant | Denial]
# The error class of a job no wait could admit (services/common/job_errors.py).
TOO_LARGE_FOR_MODEL = "document_too_large_for_model"
# Gives back a permit granted inside a claim that then failed to commit (nothing was sent).
ReleaseUnused = Callable[[Grant], None]


@dataclass(frozen=True)
class ClaimedJob:
    job_id: uuid.UUID
    tenant_id: uuid.UUID
    state_version: int
    attempt: int
    fence: int
    document_id: uuid.UUID
    document_version: int
    estimated_tokens: int
    deadline_at: datetime
    schema_version: str
    priority: str
    # The trace the job's accepting request started (services/common/tracing.py); None untraced.
    traceparent: str | None = None

    # The ids as text, made once: an attempt names them a dozen times (keys, spans, log fields).
    @cached_property
    def job_text(self) -> str:
        return str(self.job_id)

    @cached_property
    def tenant_text(self) -> str:
        return tenant_text(self.tenant_id)


@dataclass(frozen=True)
class Started:
    job: ClaimedJob
    grant: Grant
    # What validation compares the answer against, read in the claim's transaction; its
    # source_text is also the prompt's document.
    context: ValidationContext


@dataclass
class _NextHead:
    """The head job a completion's statement locked for its slot's next claim: the first tenant and
    priority the kept loads said that claim would try, and the row (None: nothing due and free).
    If the claim tries another tenant first (another slot changed the kept loads meanwhile), the
    row stays locked, and due, until the transaction ends; other slots skip it until then."""

    tenant_id: uuid.UUID
    priority: str
    row: dict[str, Any] | None = None
    used: bool = False

    def take(self, tenant_id: uuid.UUID, priority: str) -> tuple[bool, dict[str, Any] | None]:
        """(True, the row) the first time the claim asks for this tenant and priority, else (False, None)."""
        if self.used or tenant_id != self.tenant_id or priority != self.priority:
            return False, None
        self.used = True
        return True, self.row


@dataclass(frozen=True)
class Deferred:
    job_id: uuid.UUID
    reason: str
    retry_after_ms: int


@dataclass(frozen=True)
class Refused:
    """The limiter said no wait could admit the job; the claim's transaction failed it."""

    job_id: uuid.UUID
    reason: str
    priority: str
    since_accepted: float


_TENANT_TEXTS: dict[uuid.UUID, str] = {}


def tenant_text(tenant_id: uuid.UUID) -> str:
    """``str(tenant_id)``, kept: a worker serves a few tenants, and names one several times a job."""
    text = _TENANT_TEXTS.get(tenant_id)
    if text is None:
        if len(_TENANT_TEXTS) >= 10_000:
            _TENANT_TEXTS.clear()
        text = _TENANT_TEXTS[tenant_id] = str(tenant_id)
    return text


def request_key(job_id: uuid.UUID | str, fence: int) -> str:
    """The limiter request_key of the start that takes ``fence``: the same while the job is only
    deferred, so a local pool's head of the line keeps its place and a retried Acquire finds the
    permit it may already have been granted; a new one for every start."""
    return f"{job_id}:{fence}"


# What a claim ends in: a started job, a deferral, a refusal, or None when nothing is due.
Claimed = Started | Deferred | Refused | None


class Nudge(Protocol):
    """How completions wake the relay (services/inference/nudge.py ``RelayNudge``)."""

    def ride(self, conn: Any) -> float | None: ...  # NOTIFY in conn's open transaction, or not

    def carried(self, ride: float) -> None: ...  # the transaction that took it on committed

    def poke(self) -> None: ...  # a commit that took none on


@dataclass(frozen=True)
class Completion:
    """What an attempt ends in: the job's next state and everything written with it."""

    state: str
    hops: tuple[Hop, ...]
    result: Mapping[str, Any] | None = None
    review_reasons: list[dict[str, Any]] | None = None
    error_class: str | None = None
    error_message: str | None = None
    usage: Mapping[str, int] | None = None
    policy_version: str | None = None
    available_at: datetime | None = None
    refund_attempt: bool = False  # nothing was sent: the attempt does not count


class Claims:
    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        worker_id: str,
        model: str,
        lease_seconds: float,
        aging_seconds: float,
        nudge: Nudge | None = None,
        suppliers: SupplierCache | None = None,
        loads_seconds: float = 0.0,
    ) -> None:
        """``nudge`` wakes the relay after a completion that wrote an outbox event (the worker's
        ``RelayNudge``: a NOTIFY in the completion's own transaction at most once per window, else
        a coalesced one after it); without it each such completion sends its own NOTIFY."""
        self._pool = pool
        self._nudge = nudge
        self._worker_id = worker_id
        self._model = model
        self._lease_seconds = lease_seconds
        self._aging = timedelta(seconds=aging_seconds)
        self._suppliers = suppliers or SupplierCache()
        self._loads = KeptLoads(loads_seconds)

    def claim(self, acquire: Acquire, release_unused: ReleaseUnused) -> Claimed:
        """Start the next job by fair share, defer it when the limiter says no, or None when no
        tenant has a job due. A permit granted inside a claim whose transaction fails is released
        as not sent."""
        with _releasing_on_failure(acquire, release_unused) as acquire_once:
            with unit_of_work(self._pool) as uow:
                claimed = self._claim(uow, acquire_once)
        return _observed(claimed)

    def _claim(self, uow: UnitOfWork, acquire: Acquire, next_head: _NextHead | None = None) -> Claimed:
        kept = self._loads.current()
        if kept is not None:
            claimed = self._claim_among(uow, acquire, *kept, next_head)
            if claimed is not None:
                return claimed
            # Nothing startable among the tenants this process kept: the database may know more.
        rows = uow.execute(Q["tenant_loads"]).fetchall()
        metrics.TENANT_LOADS_READS.inc()
        loads = {row["tenant_id"]: TenantLoad(**_load_fields(row)) for row in rows}
        if not loads:
            self._loads.keep(loads, None)
            return None
        now = rows[0]["now"]
        self._loads.keep(loads, now)
        return self._claim_among(uow, acquire, loads, now, next_head)

    def _next_head(self, finishing: uuid.UUID) -> _NextHead | None:
        """The tenant and priority the next claim will try first, by the kept loads once the job of
        ``finishing`` has ended; None when no loads are kept (that claim reads them first)."""
        kept = self._loads.current()
        if kept is None:
            return None
        loads, now = kept
        load = loads.get(finishing)
        if load is not None:
            loads[finishing] = dataclasses.replace(load, running=max(0, load.running - 1))
        order = order_tenants(list(loads.values()), now, self._aging)
        if not order:
            return None
        first = loads[order[0]]
        priority = prefer(first.interactive_head, first.batch_head, self._aging)
        return None if priority is None else _NextHead(first.tenant_id, priority)

    def _claim_among(
        self,
        uow: UnitOfWork,
        acquire: Acquire,
        loads: Mapping[uuid.UUID, TenantLoad],
        now: datetime,
        next_head: _NextHead | None = None,
    ) -> Claimed:
        for tenant_id in order_tenants(list(loads.values()), now, self._aging):
            head = self._head(uow, loads[tenant_id], next_head)
            if head is None:
                self._loads.forget(tenant_id)
                continue  # its due jobs are being claimed by other slots right now
            head_text = str(head["id"])
            with tracing.span(
                "limiter acquire",
                tracing.valid(head["traceparent"]),
                {"job_id": head_text, "tenant_id": tenant_text(tenant_id)},
                kind=tracing.SpanKind.CLIENT,
            ) as span:
                key = request_key(head_text, head["fence"] + 1)
                try:
                    decision = acquire(tenant_id, int(head["estimated_tokens"]), key)
                except NeverAdmittable as exc:
                    span.set_attribute("limiter.decision", "never_admittable")
                    self._loads.forget(tenant_id)
                    return self._refuse(uow, head["id"], str(exc))
                span.set_attribute(
                    "limiter.decision",
                    "granted" if isinstance(decision, Grant) else decision.reason.value,
                )
            if isinstance(decision, Denial):
                seconds = decision.retry_after_ms / 1000
                uow.execute(Q["defer_job"], {"job_id": head["id"], "seconds": seconds})
                metrics.DEFERRALS.labels(decision.reason.value).inc()
                self._loads.forget(tenant_id)  # its heads moved; the next read has them
                return Deferred(head["id"], decision.reason.value, decision.retry_after_ms)
            job, context = self._start(uow, tenant_id, head["id"])
            self._loads.started(tenant_id, head["interactive_next"], head["batch_next"])
            return Started(job, decision, context)
        return None

    def _refuse(self, uow: UnitOfWork, job_id: uuid.UUID, why: str) -> Refused:
        params = {"job_id": job_id, "error_class": TOO_LARGE_FOR_MODEL, "error_message": why[:500]}
        row = uow.execute(Q["refuse_job"], params).fetchone()
        assert row is not None, "the head row is locked by this transaction"
        event = EVENT_FOR_STATE[states.FAILED_TERMINAL]
        detail = {"error_class": TOO_LARGE_FOR_MODEL}
        change = JobChange(
            row["tenant_id"], job_id, states.FAILED_TERMINAL, row["state_version"], event, detail
        )
        uow.record(change)
        metrics.REFUSED.inc()
        log.warning("job %s failed: no wait could admit it (%s)", job_id, why)
        return Refused(job_id, why, row["priority"], row["since_accepted"])

    def _head(
        self, uow: UnitOfWork, load: TenantLoad, next_head: _NextHead | None = None
    ) -> dict[str, Any] | None:
        """Lock the tenant's next due job: of the priority its heads prefer, else of the other one.

        The load's heads are read a moment earlier and include jobs other slots hold or that are
        not due yet, so the other priority is the fallback when the preferred one has none free.
        What the completion's statement already locked for this tenant and priority is not read again.
        """
        first = prefer(load.interactive_head, load.batch_head, self._aging)
        if first is None:
            return None
        for priority in (first, "batch" if first == "interactive" else "interactive"):
            read, head = next_head.take(load.tenant_id, priority) if next_head else (False, None)
            if not read:
                head = uow.execute(
                    Q["head_job"], {"tenant_id": load.tenant_id, "priority": priority}
                ).fetchone()
            if head is not None:
                return head
        return None

    def _start(
        self, uow: UnitOfWork, tenant_id: uuid.UUID, job_id: uuid.UUID
    ) -> tuple[ClaimedJob, ValidationContext]:
        # The RUNNING change's version and detail (attempt, fence, lease) are the statement's own.
        change = JobChange(tenant_id, job_id, states.RUNNING, 0, None)
        params = {
            **change.params(),
            "lease_seconds": self._lease_seconds,
            "worker_id": self._worker_id,
            "model": self._model,
        }
        row = uow.execute(Q["start_job"], params).fetchone()
        assert row is not None, "the head row is locked by this transaction"
        assert row["text"] is not None, "a claimed job has its document"
        context = ValidationContext(
            source_text=row["text"],
            allowed_currencies=frozenset(row["allowed_currencies"]),
            suppliers=self._master_suppliers(uow, row["tenant_id"], row["suppliers_version"]),
        )
        job = ClaimedJob(
            job_id=row["id"],
            tenant_id=row["tenant_id"],
            state_version=row["state_version"],
            attempt=row["attempt"],
            fence=row["fence"],
            document_id=row["document_id"],
            document_version=row["document_version"],
            estimated_tokens=row["estimated_tokens"],
            deadline_at=row["deadline_at"],
            schema_version=row["schema_version"],
            priority=row["priority"],
            traceparent=tracing.valid(row["traceparent"]),
        )
        return job, context

    def _master_suppliers(self, uow: UnitOfWork, tenant_id: uuid.UUID, version: int) -> Suppliers:
        kept = self._suppliers.get(tenant_id, version)
        if kept is not None:
            return kept
        rows = uow.execute(Q["tenant_suppliers"], {"tenant_id": tenant_id}).fetchall()
        suppliers = {normalize_tax_id(r["tax_id"]): _supplier(r) for r in rows if r["tax_id"] is not None}
        metrics.SUPPLIER_READS.inc()
        # Kept under the version this read saw, which may be newer than the start's.
        return self._suppliers.put(tenant_id, rows[0]["suppliers_version"], suppliers)

    def complete(self, job: ClaimedJob, completion: Completion) -> bool:
        """Write the attempt's outcome if this worker still owns the job; False when it was stale."""
        return self.complete_then_claim(job, completion, None)[0]

    def complete_then_claim(
        self, job: ClaimedJob, completion: Completion, claim_next: tuple[Acquire, ReleaseUnused] | None
    ) -> tuple[bool, Claimed]:
        """Write the attempt's outcome as ``complete`` does and, in the same transaction, make the
        slot's next claim (when ``claim_next`` gives its limiter calls): a slot that keeps working
        pays one transaction per job, and a slot that finds nothing due pays none of its own.

        The completion is as fenced as alone: a stale one writes only its ``stale`` attempt rows,
        and the claim that follows it is the same fair claim. If the transaction fails, neither
        was written, and a permit its claim was granted is released as not sent.
        """
        acquire, release_unused = claim_next if claim_next else (_no_acquire, _no_release)
        ride: float | None = None
        with _releasing_on_failure(acquire, release_unused) as acquire_once:
            with self._completion_unit() as uow:
                next_head = self._next_head(job.tenant_id) if claim_next else None
                written = self._complete(uow, job, completion, next_head)
                if written is not None:
                    self._loads.finished(job.tenant_id)
                claimed = self._claim(uow, acquire_once, next_head) if claim_next else None
                if uow.recorded and self._nudge is not None:
                    ride = self._nudge.ride(uow.conn)
        if uow.recorded and self._nudge is not None:
            if ride is not None:
                self._nudge.carried(ride)
            else:
                self._nudge.poke()
        if written is not None:
            # Observed once the transition committed: a rolled-back completion is not an outcome.
            sli.observe_completion(written["priority"], completion.state, written["since_accepted"])
        else:
            metrics.STALE_COMPLETIONS.inc()
            log.warning(
                "job %s: ownership lost (fence %d); result of attempt %d discarded",
                job.job_id,
                job.fence,
                job.attempt,
            )
        return written is not None, _observed(claimed)

    def _complete(
        self, uow: UnitOfWork, job: ClaimedJob, completion: Completion, next_head: _NextHead | None = None
    ) -> dict[str, Any] | None:
        """One statement writes the outcome, the attempt's hops and the change's events when the
        fence holds, and only the hops (as ``stale``) when it does not; given ``next_head``, the
        same statement locks that head job and keeps it there for the claim that follows."""
        change = JobChange(
            job.tenant_id,
            job.job_id,
            completion.state,
            0,  # the statement's own: the version its UPDATE gives the row
            EVENT_FOR_STATE[completion.state],
            {"attempt": job.attempt, "error_class": completion.error_class},
            # Consumers continue from the attempt's span when it is current.
            traceparent=tracing.current_traceparent() or job.traceparent,
        )
        params = {
            **change.params(),
            "fence": job.fence,
            "attempt": job.attempt,
            "refund": 1 if completion.refund_attempt else 0,
            "result": Jsonb(dict(completion.result)) if completion.result is not None else None,
            "review_reasons": Jsonb(completion.review_reasons) if completion.review_reasons else None,
            "error_class": completion.error_class,
            "error_message": completion.error_message,
            "usage": Jsonb(dict(completion.usage)) if completion.usage is not None else None,
            "policy_version": completion.policy_version,
            "available_at": completion.available_at,
            "terminal": completion.state in states.TERMINAL,
            "worker_id": self._worker_id[:64],
            "hops": Jsonb([_hop_fields(hop) for hop in completion.hops]),
        }
        if next_head is None:
            row = uow.execute(Q["complete_job"], params).fetchone()
        else:
            params["next_head_tenant_id"] = next_head.tenant_id
            params["next_head_priority"] = next_head.priority
            both = uow.execute(Q["complete_job_then_head"], params).fetchone()
            assert both is not None, "the statement always returns its one row"
            if both["head_id"] is not None:
                next_head.row = {c: both[f"head_{c}"] for c in _HEAD_COLUMNS}
            row = both if both["state_version"] is not None else None
        if row is None:
            return None
        uow.recorded_by_statement(change)
        if completion.state == states.REVIEW_REQUIRED:
            uow.execute(
                Q["open_review_task"],
                {
                    "task_id": new_id(),
                    "tenant_id": job.tenant_id,
                    "job_id": job.job_id,
                    "reasons": Jsonb(completion.review_reasons or []),
                    "job_version": row["state_version"],
                    "detail": Jsonb({"attempt": job.attempt, "fence": job.fence}),
                },
            )
        return row

    @contextmanager
    def _completion_unit(self) -> Iterator[UnitOfWork]:
        if self._nudge is None:
            with unit_of_work(self._pool) as uow:
                yield uow
            return
        with self._pool.connection() as conn:
            uow = UnitOfWork(conn)
            with conn.transaction():
                yield uow

    def renew(self, owned: Mapping[uuid.UUID, int]) -> set[uuid.UUID]:
        """Extend the leases of jobs this process still owns; returns the ids it no longer owns."""
        if not owned:
            return set()
        ids = list(owned)
        with self._pool.connection() as conn:
            rows = conn.execute(
                Q["renew_leases"],
                {"job_ids": ids, "fences": [owned[i] for i in ids], "lease_seconds": self._lease_seconds},
            ).fetchall()
        return set(ids) - {row["id"] for row in rows}


@contextmanager
def _releasing_on_failure(acquire: Acquire, release_unused: ReleaseUnused) -> Iterator[Acquire]:
    """An ``acquire`` that remembers its grants, and gives them back as not sent when the block
    (the claim's transaction) fails: nothing was sent under them."""
    granted: list[Grant] = []

    def acquire_once(tenant_id: uuid.UUID, tokens: int, key: str) -> Grant | Denial:
        decision = acquire(tenant_id, tokens, key)
        if isinstance(decision, Grant):
            granted.append(decision)
        return decision

    try:
        yield acquire_once
    except BaseException:
        for grant in granted:
            release_unused(grant)
        raise


def _observed(claimed: Claimed) -> Claimed:
    if isinstance(claimed, Refused):
        # Observed once the failure committed, as every completion is.
        sli.observe_completion(claimed.priority, states.FAILED_TERMINAL, claimed.since_accepted)
    return claimed


def _no_acquire(tenant_id: uuid.UUID, tokens: int, key: str) -> Grant | Denial:
    raise AssertionError("a completion without a next claim asks the limiter for nothing")


def _no_release(grant: Grant) -> None:
    raise AssertionError("a completion without a next claim holds no permit")


def _excerpt(text: str | None) -> str | None:
    """At most 1,000 characters (the column holds 4 KiB): enough to read what a provider said."""
    return text[:1000] if text else None


def _load_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        k: row[k]
        for k in ("tenant_id", "weight", "max_in_flight", "running", "interactive_head", "batch_head")
    }


def _supplier(row: Mapping[str, Any]) -> MasterSupplier:
    return MasterSupplier(row["tax_id"], row["name"], row["iban"], row["currency"])


def _hop_fields(hop: Hop) -> dict[str, Any]:
    """A hop as the completion's statement logs it (one element of its jsonb array)."""
    return {
        "channel": hop.channel,
        "model": hop.model,
        "started_at": hop.started_at.isoformat(),
        "ended_at": hop.ended_at.isoformat(),
        "outcome": hop.outcome,
        "http_status": hop.http_status,
        "error_class": hop.error_class.value if hop.error_class else None,
        "retry_after_ms": hop.retry_after_ms,
        "input_tokens": hop.input_tokens,
        "output_tokens": hop.output_tokens,
        "latency_ms": hop.latency_ms,
        "error_message": _excerpt(hop.error_message or hop.skip_reason),
        "time_to_first_token_ms": hop.time_to_first_token_ms,
        "inter_token_ms": hop.inter_token_ms,
    }
