"""What a client reads: the 202 body, the status body and list items, with words an agent cannot misread.

A 2xx is easy to mistake for "finished" (seed 004): every body says in words whether the job is
complete, carries a boolean ``done``, and says when to look again.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

from services.common import states
from services.common.job_errors import tenant_error

JSON = dict[str, Any]

_POLL_FLOOR = {"interactive": 2, "batch": 10}
_POLL_CEILING = {"interactive": 30, "batch": 300}
# A job awaiting a human: people take minutes, not seconds.
_REVIEW_POLL = 60


def status_url(job_id: object) -> str:
    return f"/v1/extraction-jobs/{job_id}"


def poll_after(priority: str, estimated_seconds: float) -> int:
    """A first poll after about a quarter of the expected wait, within per-priority bounds."""
    return int(min(_POLL_CEILING[priority], max(_POLL_FLOOR[priority], math.ceil(estimated_seconds / 4))))


def accepted_body(job: JSON, *, estimated_seconds: int, replay: bool) -> JSON:
    url = status_url(job["id"])
    state = job["state"]
    done = states.is_done(state)
    wait = poll_after(job["priority"], estimated_seconds)
    if done:
        message = (
            f"This request repeats an earlier one (same Idempotency-Key); job {job['id']} has already "
            f"finished in state {state}. Read the result with GET {url}."
        )
    else:
        repeat = "This request repeats an earlier one (same Idempotency-Key). " if replay else ""
        message = (
            f"{repeat}Extraction job {job['id']} has STARTED and is NOT complete; no result exists yet. "
            f"Do not report success. Check its status with GET {url} after at least {wait} seconds; "
            "`done` becomes true when it has finished."
        )
    return {
        "job_id": str(job["id"]),
        "state": state,
        "done": done,
        "state_version": job["state_version"],
        "status_url": url,
        "poll_after_seconds": wait,
        "estimated_duration_seconds": estimated_seconds,
        "message": message,
    }


def _state_message(job: JSON, url: str, wait: int | None) -> str:
    state = job["state"]
    if state == states.READY:
        return f"Queued for extraction; NOT complete. Do not proceed yet. Check again after {wait} seconds."
    if state == states.RUNNING:
        return f"Extraction is running; NOT complete. Do not proceed yet. Check again after {wait} seconds."
    if state == states.RETRY_SCHEDULED:
        return (
            "An attempt failed and a retry is scheduled; NOT complete. Do not proceed yet. "
            f"Check again after {wait} seconds."
        )
    if state == states.SUCCEEDED:
        if job.get("decided_by") == "reviewer":
            return "Complete: a reviewer approved the extraction. The result is in `result`."
        return "Complete: the extraction passed validation. The result is in `result`."
    if state == states.REVIEW_REQUIRED:
        return (
            "Waiting for a human reviewer; NOT complete. The extraction did NOT pass validation "
            "(see `review.reasons`) and has not been sent to the ERP. Do not treat it as a result. "
            f"Check again after {wait} seconds; a reviewer's approval makes it SUCCEEDED, a "
            "rejection makes it REJECTED."
        )
    if state == states.REJECTED:
        return "Rejected by a reviewer; no result will be delivered. The reviewer's reason is in `error`."
    if state == states.FAILED_TERMINAL:
        error_class = tenant_error(job.get("error_class"), None, state)["class"]
        return f"Failed permanently ({error_class}); no result will be produced."
    return "Cancelled; no result will be produced."


def status_body(job: JSON) -> JSON:
    url = status_url(job["id"])
    state = job["state"]
    done = states.is_done(state)
    now: datetime = job["now"]
    end = job["finished_at"] if done and job["finished_at"] is not None else now
    wait: int | None = None
    if state in states.AWAITING_REVIEW:
        end = job["finished_at"] if job["finished_at"] is not None else now
        wait = _REVIEW_POLL
    elif not done:
        if state == states.RETRY_SCHEDULED and job["available_at"] > now:
            wait = max(1, math.ceil((job["available_at"] - now).total_seconds()))
        else:
            wait = (
                _POLL_FLOOR[job["priority"]] if state == states.RUNNING else poll_after(job["priority"], 20)
            )
    body: JSON = {
        "job_id": str(job["id"]),
        "state": state,
        "done": done,
        "state_version": job["state_version"],
        "attempts": job["attempt"],
        "priority": job["priority"],
        "document": {"document_id": str(job["document_id"]), "version": job["document_version"]},
        "schema": job["schema_version"],
        "created_at": job["created_at"].isoformat(),
        "finished_at": job["finished_at"].isoformat() if job["finished_at"] is not None else None,
        "deadline_at": job["deadline_at"].isoformat(),
        "elapsed_seconds": round(max(0.0, (end - job["created_at"]).total_seconds()), 3),
        "status_url": url,
        "message": _state_message(job, url, wait),
    }
    if wait is not None:
        body["poll_after_seconds"] = wait
    if state in (states.SUCCEEDED, states.REVIEW_REQUIRED):
        body["result"] = job.get("result")
        body["policy_version"] = job.get("policy_version")
    if state == states.SUCCEEDED:
        body["decided_by"] = job.get("decided_by") or "model"
        if job.get("correction"):
            body["correction"] = job["correction"]
    if state in (states.REVIEW_REQUIRED, states.REJECTED):
        review: JSON = {"reasons": job["review_reasons"] or []}
        if job.get("review_id") is not None:
            review["review_id"] = str(job["review_id"])
            review["review_url"] = f"/v1/reviews/{job['review_id']}"
        body["review"] = review
    if job.get("erp"):
        body["erp"] = job["erp"]
    # The tenant reads a stable class and words written for it; the raw text is the operator's.
    if state == states.RETRY_SCHEDULED and job.get("error_class"):
        body["last_error"] = tenant_error(job["error_class"], job["error_message"], state)
    if state in (states.FAILED_TERMINAL, states.REJECTED):
        body["error"] = tenant_error(job["error_class"], job["error_message"], state)
    return body


def summary_body(job: JSON) -> JSON:
    return {
        "job_id": str(job["id"]),
        "state": job["state"],
        "done": states.is_done(job["state"]),
        "state_version": job["state_version"],
        "priority": job["priority"],
        "created_at": job["created_at"].isoformat(),
        "updated_at": job["updated_at"].isoformat(),
        "status_url": status_url(job["id"]),
    }
