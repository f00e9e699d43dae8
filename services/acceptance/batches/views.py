"""What a client reads about a batch: the 202 body, the status body and its items, each saying in
words whether the batch is complete and what to do next (seed 004). Pure functions of rows.

A batch is done when every item is final (SUCCEEDED, FAILED_TERMINAL, REJECTED, CANCELLED). An item
waiting for a human reviewer (REVIEW_REQUIRED) is not final, so its batch is still running: its
result did not pass validation and must not be used until a reviewer decides.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from services.acceptance import views as job_views
from services.common import states
from services.common.job_errors import tenant_error

JSON = dict[str, Any]

COMPLETED = "completed"
COMPLETED_WITH_ERRORS = "completed_with_errors"
DONE = frozenset({COMPLETED, COMPLETED_WITH_ERRORS})
# The items filter that lists every item that ended without a result.
ERRORS = "errors"
ERROR_STATES = (states.FAILED_TERMINAL, states.REJECTED, states.CANCELLED)
# People take minutes, not seconds; and a batch whose last items just finished closes within a sweep.
_REVIEW_POLL = 60
_CLOSING_POLL = 2


def status_url(batch_id: object) -> str:
    return f"/v1/extraction-batches/{batch_id}"


def items_url(batch_id: object) -> str:
    return f"{status_url(batch_id)}/items"


def errors_url(batch_id: object) -> str:
    return f"{items_url(batch_id)}?state={ERRORS}"


def counts(batch: JSON) -> JSON:
    """The batch's counts from its row and its summed counters."""
    total = int(batch["total"])
    by_state = {name: int(batch[name]) for name in ("succeeded", "review_required", "failed", "rejected")}
    cancelled = int(batch["cancelled"])
    processed = by_state["succeeded"] + by_state["failed"] + by_state["rejected"] + cancelled
    return {
        "total": total,
        "processed": processed,
        "pending": max(0, total - processed - by_state["review_required"]),
        **by_state,
        "cancelled": cancelled,
    }


def poll_after(batch: JSON, expected_jobs_per_second: float) -> int | None:
    """When to look again; None when there is nothing to wait for (done, or a request to resend)."""
    state = batch["state"]
    if state in DONE or state == "accepting":
        return None
    c = counts(batch)
    if c["processed"] >= c["total"]:
        return _CLOSING_POLL
    if c["pending"] == 0:
        return _REVIEW_POLL
    return job_views.poll_after(batch["priority"], 20 + c["pending"] / expected_jobs_per_second)


def message(batch: JSON, wait: int | None) -> str:
    bid, c, state = batch["id"], counts(batch), batch["state"]
    url, items = status_url(bid), items_url(bid)
    if state == "accepting":
        return (
            f"Batch {bid} is INCOMPLETE: only {batch['accepted']} of {c['total']} items were accepted "
            "before the request that creates it was interrupted; the others do not exist yet. Do not "
            "report success. Send the same request again with the same Idempotency-Key to accept the rest."
        )
    if state == COMPLETED:
        return (
            f"Complete: all {c['total']} items of batch {bid} succeeded. Read each item's result with "
            f"GET {items} (pages of up to 200 items; follow next_cursor)."
        )
    if state == COMPLETED_WITH_ERRORS:
        unsuccessful = c["failed"] + c["rejected"] + c["cancelled"]
        return (
            f"Finished WITH ERRORS: {c['succeeded']} of {c['total']} items of batch {bid} succeeded; "
            f"{unsuccessful} did not ({c['failed']} failed, {c['rejected']} rejected by a reviewer, "
            f"{c['cancelled']} cancelled) and have no result. Do not report the batch as fully "
            f"successful. GET {errors_url(bid)} lists the items without a result and why; "
            f"GET {items}?state=SUCCEEDED lists the results."
        )
    if c["processed"] >= c["total"]:
        return (
            f"Every item of batch {bid} has finished and the batch is being closed; it is NOT reported "
            f"complete yet. Check again with GET {url} after {wait} seconds to read its final state."
        )
    progress = (
        f"{c['processed']} of {c['total']} items are finished ({c['succeeded']} succeeded, "
        f"{c['failed'] + c['rejected'] + c['cancelled']} without a result)"
    )
    if c["pending"] == 0:
        return (
            f"Batch {bid} is NOT complete: {progress}, and the other {c['review_required']} did NOT pass "
            f"validation and wait for a human reviewer (GET {items}?state=REVIEW_REQUIRED); their "
            f"results must not be used yet. Do not report success. Check again with GET {url} after "
            f"{wait} seconds; a reviewer's decision finishes each of them."
        )
    review = f"; {c['review_required']} wait for a human reviewer" if c["review_required"] else ""
    return (
        f"Batch {bid} is running and NOT complete: {progress}{review}; {c['pending']} are still being "
        f"extracted. Do not report success yet. Results of finished items can be read now with GET "
        f"{items}?state=SUCCEEDED. Check the batch again with GET {url} after at least {wait} seconds; "
        "`done` becomes true when every item has finished."
    )


def accepted_body(
    batch: JSON, *, estimated_seconds: int, replay: bool, expected_jobs_per_second: float
) -> JSON:
    """The 202 answer: the batch has started, nothing in it is complete (or, for a replay, where it is)."""
    bid = batch["id"]
    wait = poll_after(batch, expected_jobs_per_second)
    if replay:
        text = "This request repeats an earlier one (same Idempotency-Key). " + message(batch, wait)
    else:
        text = (
            f"Batch {bid} has STARTED: {batch['total']} extraction jobs were accepted and NONE is "
            "complete yet; no result exists yet. Do not report success. Check the batch with GET "
            f"{status_url(bid)} after at least {wait} seconds; `done` becomes true when every item has "
            f"finished, and `counts` says how many succeeded. Finished items can be read meanwhile with "
            f"GET {items_url(bid)}."
        )
    return {
        "batch_id": str(bid),
        "state": batch["state"],
        "done": batch["state"] in DONE,
        "counts": counts(batch),
        "status_url": status_url(bid),
        "items_url": items_url(bid),
        "poll_after_seconds": wait or _CLOSING_POLL,
        "estimated_duration_seconds": estimated_seconds,
        "message": text,
    }


def status_body(batch: JSON, expected_jobs_per_second: float) -> JSON:
    bid = batch["id"]
    now: datetime = batch["now"]
    end = batch["completed_at"] or now
    wait = poll_after(batch, expected_jobs_per_second)
    body: JSON = {
        "batch_id": str(bid),
        "state": batch["state"],
        "done": batch["state"] in DONE,
        "counts": counts(batch),
        "priority": batch["priority"],
        "created_at": batch["created_at"].isoformat(),
        "completed_at": batch["completed_at"].isoformat() if batch["completed_at"] else None,
        "elapsed_seconds": round(max(0.0, (end - batch["created_at"]).total_seconds()), 3),
        "status_url": status_url(bid),
        "items_url": items_url(bid),
        "message": message(batch, wait),
    }
    if wait is not None:
        body["poll_after_seconds"] = wait
    if batch["state"] == COMPLETED_WITH_ERRORS:
        body["errors_url"] = errors_url(bid)
    return body


def item_body(job: JSON) -> JSON:
    """One item: its job's state, and its result only once it SUCCEEDED (a result waiting for review
    did not pass validation; its reasons are here, the unvalidated fields at the job's status_url)."""
    state = job["state"]
    body: JSON = {
        "index": job["batch_index"],
        "job_id": str(job["id"]),
        "idempotency_key": job["idempotency_key"],
        "state": state,
        "done": states.is_done(state),
        "state_version": job["state_version"],
        "status_url": job_views.status_url(job["id"]),
    }
    if state == states.SUCCEEDED:
        body["result"] = job["result"]
        body["decided_by"] = job["decided_by"] or "model"
    if state in (states.REVIEW_REQUIRED, states.REJECTED):
        body["review"] = {"reasons": job["review_reasons"] or []}
    if state in ERROR_STATES:
        body["error"] = tenant_error(job["error_class"], job["error_message"], state)
    return body


def estimated_seconds(pending_jobs: int, items: int, expected_jobs_per_second: float) -> int:
    """How long until the last of ``items`` new jobs behind ``pending_jobs`` others is likely done."""
    return math.ceil(20 + (pending_jobs + items) / expected_jobs_per_second)
