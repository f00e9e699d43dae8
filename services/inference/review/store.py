"""Review tasks as a reviewer works them: list, read, claim, and decide (approve, correct, reject).

A task is claimed under a fence like a worker's lease. A decision is one transaction: the task is
locked, the claim checked (this reviewer's, this fence, not run out), the job changed under its
state and state version, the job event and outbox event recorded (``common/uow.py``), the task
closed and the audit trail written. Two reviewers cannot both decide one task: the second finds a
claim that is not theirs, or a task already decided.

Two kinds of task:

- ``validation``: the model's result did not pass validation (the job is REVIEW_REQUIRED).
  approve → SUCCEEDED with the model's result; correct → the corrected result is validated again
  under the current policy and, if it passes, SUCCEEDED with the reviewer's changes kept beside
  the model's; reject → REJECTED. SUCCEEDED and REJECTED are delivered to the ERP like any
  outcome.
- ``erp_rejected``: an ERP acknowledged a delivered result as rejected (the job is SUCCEEDED).
  correct → a corrected result as a new state version, delivered again; approve → the result
  stands as delivered; reject → the invoice is not to be posted. The last two change no state and
  are recorded in the job's events.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from services.common import events, sli, states
from services.common.api.auth import Principal
from services.common.api.cursor import decode_cursor, encode_cursor
from services.common.api.errors import Conflict, NotFound, Unprocessable
from services.common.queries import load_queries
from services.common.uow import AsyncUnitOfWork, JobChange, OutboxNotifier, async_unit_of_work
from services.inference.review import metrics
from services.inference.validation import (
    MasterSupplier,
    ValidationContext,
    normalize_tax_id,
    resolve_span,
    split_pages,
    validate,
)

Q = load_queries(Path(__file__).with_name("sql") / "review.sql")
JSON = dict[str, Any]

DECIDED = ("approved", "corrected", "rejected")
_FIRST_PAGE = (datetime.min.replace(tzinfo=UTC), uuid.UUID(int=0))
# The reviewer's changes are the evidence of the fields they change: these rules do not apply to them.
_EVIDENCE_CODES = frozenset({"evidence_missing", "evidence_in_instruction"})


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def _not_found() -> NotFound:
    return NotFound("no such review for this tenant", code="review_not_found")


class Reviews:
    def __init__(
        self, pool: AsyncConnectionPool[Any], notifier: OutboxNotifier | None, claim_seconds: float
    ) -> None:
        self._pool = pool
        self._notifier = notifier
        self._claim_seconds = claim_seconds

    # ------------------------------------------------------------------ reading

    async def list(self, tenant_id: uuid.UUID, *, state: str | None, cursor: str | None, limit: int) -> JSON:
        after_created, after_id = decode_cursor(cursor) if cursor else _FIRST_PAGE
        params = {
            "tenant_id": tenant_id,
            "state": state,
            "after_created_at": after_created,
            "after_id": after_id,
            "limit": limit + 1,
        }
        async with self._pool.connection() as conn:
            rows = await (await conn.execute(Q["list_reviews"], params)).fetchall()
        page, more = rows[:limit], len(rows) > limit
        next_cursor = encode_cursor(page[-1]["created_at"], page[-1]["id"]) if more and page else None
        return {"reviews": [_summary(r) for r in page], "next_cursor": next_cursor}

    async def get(self, tenant_id: uuid.UUID, review_id: uuid.UUID | None) -> JSON:
        if review_id is None:
            raise _not_found()
        async with self._pool.connection() as conn:
            row = await (
                await conn.execute(Q["get_review"], {"review_id": review_id, "tenant_id": tenant_id})
            ).fetchone()
            if row is None:
                raise _not_found()
            history = await (await conn.execute(Q["review_history"], {"review_id": review_id})).fetchall()
        return _detail(row, history)

    # ------------------------------------------------------------------ claiming

    async def claim(self, reviewer: Principal, review_id: uuid.UUID | None) -> JSON:
        tenant_id = _tenant(reviewer)
        if review_id is None:
            raise _not_found()
        async with async_unit_of_work(self._pool, self._notifier) as uow:
            claimed = await (
                await uow.execute(
                    Q["claim_review"],
                    {
                        "review_id": review_id,
                        "tenant_id": tenant_id,
                        "owner": reviewer.prefix,
                        "owner_label": reviewer.label,
                        "claim_seconds": self._claim_seconds,
                    },
                )
            ).fetchone()
            if claimed is None:
                task = await self._locked(uow, tenant_id, review_id)
                raise _claim_refused(task)
            await self._audit(uow, tenant_id, review_id, reviewer, "claimed", claimed["fence"], None)
        metrics.CLAIMS.inc()
        return {
            "review_id": str(review_id),
            "state": "claimed",
            "fence": claimed["fence"],
            "claimed_until": _iso(claimed["claimed_until"]),
            "owner": reviewer.label or reviewer.prefix,
            "message": (
                "Claimed: you alone may decide this review until claimed_until. Send the fence with "
                "your decision (:approve, :correct or :reject)."
            ),
        }

    # ------------------------------------------------------------------ deciding

    async def approve(self, reviewer: Principal, review_id: uuid.UUID | None, fence: int) -> JSON:
        return await self._decide(reviewer, review_id, fence, "approved", None, None)

    async def correct(
        self, reviewer: Principal, review_id: uuid.UUID | None, fence: int, changes: Mapping[str, Any]
    ) -> JSON:
        return await self._decide(reviewer, review_id, fence, "corrected", dict(changes), None)

    async def reject(self, reviewer: Principal, review_id: uuid.UUID | None, fence: int, reason: str) -> JSON:
        return await self._decide(reviewer, review_id, fence, "rejected", None, reason)

    async def _decide(
        self,
        reviewer: Principal,
        review_id: uuid.UUID | None,
        fence: int,
        action: str,
        changes: dict[str, Any] | None,
        reason: str | None,
    ) -> JSON:
        tenant_id = _tenant(reviewer)
        if review_id is None:
            raise _not_found()
        async with async_unit_of_work(self._pool, self._notifier) as uow:
            task = await self._locked(uow, tenant_id, review_id)
            _check_claim(task, reviewer, fence)
            job = await (
                await uow.execute(Q["job_for_decision"], {"job_id": task["job_id"], "tenant_id": tenant_id})
            ).fetchone()
            assert job is not None, "a review task's job exists"
            who = reviewer.label or reviewer.prefix
            decision: JSON = {"action": action, "reviewer": who, "at": datetime.now(UTC).isoformat()}
            if reason is not None:
                decision["reason"] = reason
            corrected: JSON | None = None
            if changes is not None:
                corrected = await _corrected(uow, job, changes)
                decision["changes"] = changes
            detail = {
                "review_id": str(review_id),
                "decided_by": "reviewer",
                "reviewer": who,
                "action": action,
            }
            version: int | None
            if task["kind"] == "validation":
                version = await self._decide_validation(uow, task, job, action, corrected, decision, reason)
            else:
                version = await self._decide_erp_refusal(uow, task, job, action, corrected, decision)
            if version is not None:
                decision["job_state_version"] = version
            done = await (
                await uow.execute(
                    Q["decide_review"],
                    {
                        "review_id": review_id,
                        "state": action,
                        "decision": Jsonb(decision),
                        "owner": reviewer.prefix,
                        "fence": fence,
                    },
                )
            ).fetchone()
            assert done is not None, "the claim was checked under the row lock"
            await self._audit(uow, tenant_id, review_id, reviewer, action, fence, decision)
            if version is None:
                await uow.execute(Q["review_job_event"], {"job_id": task["job_id"], "detail": Jsonb(detail)})
        metrics.DECISIONS.labels(task["kind"], action).inc()
        if task["kind"] == "validation":
            sli.observe_review(job["priority"], action, job["since_accepted"])
        return await self.get(tenant_id, review_id)

    async def _decide_validation(
        self,
        uow: AsyncUnitOfWork,
        task: JSON,
        job: JSON,
        action: str,
        corrected: JSON | None,
        decision: JSON,
        reason: str | None,
    ) -> int:
        if job["state"] != states.REVIEW_REQUIRED or job["state_version"] != task["job_version"]:
            raise _job_moved(job)
        detail = {"review_id": str(task["id"]), "decided_by": "reviewer", "reviewer": decision["reviewer"]}
        if action == "rejected":
            row = await (
                await uow.execute(
                    Q["job_rejected"],
                    {"job_id": job["id"], "state_version": job["state_version"], "reason": reason},
                )
            ).fetchone()
            assert row is not None
            change = JobChange(
                job["tenant_id"],
                job["id"],
                states.REJECTED,
                row["state_version"],
                events.EXTRACTION_REJECTED,
                {**detail, "action": action},
            )
            await uow.record(change)
            return int(row["state_version"])
        return await self._succeed(
            uow, job, states.REVIEW_REQUIRED, corrected, decision, {**detail, "action": action}
        )

    async def _decide_erp_refusal(
        self, uow: AsyncUnitOfWork, task: JSON, job: JSON, action: str, corrected: JSON | None, decision: JSON
    ) -> int | None:
        if action != "corrected":
            return None  # the result stands as delivered (approved) or is not to be posted (rejected)
        if job["state"] != states.SUCCEEDED or job["state_version"] != task["job_version"]:
            raise _job_moved(job)
        detail = {
            "review_id": str(task["id"]),
            "decided_by": "reviewer",
            "reviewer": decision["reviewer"],
            "action": action,
        }
        return await self._succeed(uow, job, states.SUCCEEDED, corrected, decision, detail)

    async def _succeed(
        self,
        uow: AsyncUnitOfWork,
        job: JSON,
        from_state: str,
        corrected: JSON | None,
        decision: JSON,
        detail: JSON,
    ) -> int:
        correction = None
        if corrected is not None:
            correction = {
                "model_result": job["result"],
                "changes": decision["changes"],
                "reviewer": decision["reviewer"],
                "at": decision["at"],
            }
        row = await (
            await uow.execute(
                Q["job_succeeds"],
                {
                    "job_id": job["id"],
                    "from_state": from_state,
                    "state_version": job["state_version"],
                    "result": Jsonb(corrected if corrected is not None else job["result"]),
                    "correction": Jsonb(correction) if correction is not None else None,
                },
            )
        ).fetchone()
        assert row is not None, "the job row is locked and its state checked"
        change = JobChange(
            job["tenant_id"],
            job["id"],
            states.SUCCEEDED,
            row["state_version"],
            events.EXTRACTION_COMPLETED,
            detail,
        )
        await uow.record(change)
        return int(row["state_version"])

    # ------------------------------------------------------------------ helpers

    async def _locked(self, uow: AsyncUnitOfWork, tenant_id: uuid.UUID, review_id: uuid.UUID) -> JSON:
        task = await (
            await uow.execute(Q["lock_review"], {"review_id": review_id, "tenant_id": tenant_id})
        ).fetchone()
        if task is None:
            raise _not_found()
        result: JSON = task
        return result

    async def _audit(
        self,
        uow: AsyncUnitOfWork,
        tenant_id: uuid.UUID,
        review_id: uuid.UUID,
        reviewer: Principal,
        action: str,
        fence: int | None,
        detail: JSON | None,
    ) -> None:
        await uow.execute(
            Q["audit"],
            {
                "review_id": review_id,
                "tenant_id": tenant_id,
                "actor": reviewer.label or reviewer.prefix,
                "action": action,
                "fence": fence,
                "detail": Jsonb(detail) if detail is not None else None,
            },
        )


def _tenant(reviewer: Principal) -> uuid.UUID:
    assert reviewer.tenant is not None, "a reviewer key belongs to one tenant"
    return reviewer.tenant.id


def _job_moved(job: JSON) -> Conflict:
    return Conflict(
        f"the job is {job['state']} at version {job['state_version']}, not the result this review is about",
        code="job_moved",
        details={"job_state": job["state"], "job_state_version": job["state_version"]},
    )


def _claim_refused(task: JSON) -> Conflict:
    if task["state"] in DECIDED:
        return Conflict(f"this review was already decided ({task['state']})", code="review_decided")
    return Conflict(
        f"this review is claimed by {task['owner_label'] or 'another reviewer'} until "
        f"{_iso(task['claimed_until'])}",
        code="review_claimed",
        details={"owner": task["owner_label"], "claimed_until": _iso(task["claimed_until"])},
    )


def _check_claim(task: JSON, reviewer: Principal, fence: int) -> None:
    if task["state"] in DECIDED:
        raise Conflict(f"this review was already decided ({task['state']})", code="review_decided")
    if task["state"] != "claimed":
        raise Conflict("claim the review first (POST /v1/reviews/{id}:claim)", code="review_not_claimed")
    if task["owner"] != reviewer.prefix:
        if task["claim_live"]:
            raise _claim_refused(task)
        raise Conflict("claim the review first (POST /v1/reviews/{id}:claim)", code="review_not_claimed")
    if fence != task["fence"]:
        raise Conflict(
            f"fence {fence} is not the current claim's ({task['fence']}); claim again",
            code="stale_claim",
            details={"fence": task["fence"]},
        )
    if not task["claim_live"]:
        raise Conflict("your claim ran out; claim the review again", code="claim_expired")


async def _corrected(uow: AsyncUnitOfWork, job: JSON, changes: Mapping[str, Any]) -> JSON:
    """The model's result with the reviewer's changes, validated again under the current policy;
    Unprocessable (nothing changes) when it does not pass."""
    result = copy.deepcopy(job["result"])
    if not isinstance(result, dict):
        raise Unprocessable("this job has no result to correct", code="nothing_to_correct")
    for pointer, value in changes.items():
        _replace(result, pointer, value)
    suppliers = await (await uow.execute(Q["tenant_suppliers"], {"tenant_id": job["tenant_id"]})).fetchall()
    context = ValidationContext(
        source_text=job["document_text"],
        allowed_currencies=frozenset(job["allowed_currencies"]),
        suppliers={
            normalize_tax_id(s["tax_id"]): MasterSupplier(s["tax_id"], s["name"], s["iban"], s["currency"])
            for s in suppliers
        },
    )
    verdict = validate(json.dumps(result), context)
    if verdict.outcome == "model_error" or verdict.result is None:
        raise Unprocessable(
            f"the corrected result is not a valid invoice: {verdict.error_message}",
            code="correction_invalid",
            details={"error_class": verdict.error_class},
        )
    remaining = [
        r.to_json() for r in verdict.reasons if not (r.code in _EVIDENCE_CODES and _touches(r.field, changes))
    ]
    if remaining:
        raise Unprocessable(
            "the corrected result still does not pass validation: "
            + "; ".join(f"{r['code']} ({r['field']}): {r['message']}" for r in remaining[:5]),
            code="correction_invalid",
            details={"reasons": remaining},
        )
    return verdict.result


def _touches(field: str | None, changes: Mapping[str, Any]) -> bool:
    if field is None:
        return False
    return any(field == p or field.startswith(p + "/") or p.startswith(field + "/") for p in changes)


def _segments(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise Unprocessable(f"{pointer!r} is not a JSON Pointer (RFC 6901)", code="invalid_change")
    return [s.replace("~1", "/").replace("~0", "~") for s in pointer[1:].split("/")]


def _replace(document: JSON, pointer: str, value: Any) -> None:
    """Replace the value at ``pointer``; the field must exist (a correction does not add fields)."""
    parts = _segments(pointer)
    if parts[0] == "evidence":
        raise Unprocessable("evidence is the model's, not a field to correct", code="invalid_change")
    target: Any = document
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(target, dict) and part in target:
            if last:
                target[part] = value
            else:
                target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            if last:
                target[int(part)] = value
            else:
                target = target[int(part)]
        else:
            raise Unprocessable(
                f"{pointer} is not a field of the extracted result",
                code="unknown_field",
                details={"field": pointer},
            )


def _summary(row: JSON) -> JSON:
    state = row["state"]
    if state == "claimed" and row["claimed_until"] is not None and row["claimed_until"] <= row["now"]:
        state = "open"  # the claim ran out
    return {
        "review_id": str(row["id"]),
        "job_id": str(row["job_id"]),
        "kind": row["kind"],
        "state": state,
        "reasons": row["reasons"],
        "claimed_by": row["owner_label"] if state == "claimed" else None,
        "claimed_until": _iso(row["claimed_until"]) if state == "claimed" else None,
        "created_at": _iso(row["created_at"]),
        "decided_at": _iso(row["decided_at"]),
        "url": f"/v1/reviews/{row['id']}",
    }


def _evidence(result: Any, pages_text: str) -> list[JSON]:
    """Each field's evidence span with the text it names (None when it names nothing)."""
    if not isinstance(result, dict) or not isinstance(result.get("evidence"), dict):
        return []
    found = []
    for field, span in result["evidence"].items():
        entry: JSON = {"field": field, "span": span, "text": None}
        if isinstance(span, dict):
            entry["text"] = resolve_span(pages_text, span)
        found.append(entry)
    return found


def _detail(row: JSON, history: list[JSON]) -> JSON:
    body = _summary(row)
    del body["url"]
    body.update(
        {
            "fence": row["fence"],
            "job": {
                "job_id": str(row["job_id"]),
                "state": row["job_state"],
                "state_version": row["job_state_version"],
                "status_url": f"/v1/extraction-jobs/{row['job_id']}",
                "policy_version": row["policy_version"],
            },
            "document": {
                "document_id": str(row["document_id"]),
                "version": row["document_version"],
                "text": row["document_text"],
                "pages": split_pages(row["document_text"]),
            },
            "result": row["result"],
            "evidence": _evidence(row["result"], row["document_text"]),
            "correction": row["correction"],
            "decision": row["decision"],
            "delivery_id": None if row["delivery_id"] is None else str(row["delivery_id"]),
            "history": [
                {
                    "at": _iso(h["at"]),
                    "actor": h["actor"],
                    "action": h["action"],
                    "fence": h["fence"],
                    "detail": h["detail"],
                }
                for h in history
            ],
        }
    )
    return body
