"""Waiting for a job outside any model loop (seed 004), as a pure state machine both clients drive.

``Waiter`` is told what each poll answered and says how long to sleep before the next one, or gives
the one ``AwaitResult``: ``succeeded`` (only for a job that is done in SUCCEEDED),
``review_required`` (the machine has finished and a human decides), ``failed`` (done without a
result) or ``timed_out`` (the wait ran out; the job goes on). It honours the server's
``poll_after_seconds``, backs off by 1.5 times up to 60 s with jitter, and never sleeps past ``max_wait``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from fatura_sdk.errors import FaturaError
from fatura_sdk.models import (
    CANCELLED,
    REJECTED,
    REVIEW_REQUIRED,
    SUCCEEDED,
    Accepted,
    JobStatus,
)

Outcome = Literal["succeeded", "review_required", "failed", "timed_out"]
OUTCOMES: tuple[Outcome, ...] = ("succeeded", "review_required", "failed", "timed_out")
# A human reviewer takes minutes at least; the server says the same for a job awaiting review.
REVIEW_CHECK_SECONDS = 60


@dataclass(frozen=True)
class PollPolicy:
    """The first sleep is the server's ``poll_after_seconds``; each next one is the previous times
    ``multiplier`` capped at ``max_delay``, but never shorter than what the server asks for now.
    Jitter adds up to ``jitter`` times the delay (never below the server's ask, never above the cap
    unless the server asks for longer), so many waiters do not poll in step."""

    multiplier: float = 1.5
    max_delay: float = 60.0
    jitter: float = 0.1
    default_delay: float = 2.0
    min_delay: float = 0.5

    def __post_init__(self) -> None:
        if self.multiplier < 1.0 or self.max_delay <= 0 or not 0.0 <= self.jitter <= 1.0:
            raise ValueError("multiplier >= 1, max_delay > 0 and 0 <= jitter <= 1")

    def next_delay(
        self, previous: float | None, hint: float | None, rng: random.Random
    ) -> tuple[float, float]:
        """``(base, sleep)``: the backoff base to remember for the next call, and the jittered sleep."""
        if previous is None:
            base = hint if hint is not None else self.default_delay
        else:
            base = min(self.max_delay, previous * self.multiplier)
        ceiling = max(self.max_delay, hint or 0.0)
        base = min(ceiling, max(base, hint or 0.0, self.min_delay))
        return base, min(ceiling, base * (1.0 + rng.uniform(0.0, self.jitter)))


@dataclass(frozen=True)
class AwaitResult:
    """Exactly one outcome, always with the job id; ``message`` says in words what it means."""

    outcome: Outcome
    job_id: str
    state: str | None
    done: bool
    message: str
    state_version: int | None = None
    status_url: str = ""
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    review: dict[str, Any] | None = None
    poll_after_seconds: int | None = None
    waited_seconds: float = 0.0
    polls: int = 0
    replayed: bool = False
    status: JobStatus | None = field(default=None, repr=False)

    @property
    def succeeded(self) -> bool:
        return self.outcome == "succeeded"

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "outcome": self.outcome,
            "job_id": self.job_id,
            "state": self.state,
            "done": self.done,
            "state_version": self.state_version,
            "status_url": self.status_url,
            "message": self.message,
            "waited_seconds": round(self.waited_seconds, 3),
            "polls": self.polls,
        }
        for name in ("result", "error", "review", "poll_after_seconds"):
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return body


def outcome_of(status: JobStatus) -> Outcome | None:
    """The outcome a status ends the wait with; None while the machine is still working."""
    if status.state == REVIEW_REQUIRED and not status.done:
        return "review_required"
    if not status.done:
        return None
    # Success needs both words: done, and SUCCEEDED. Any other final state has no result.
    return "succeeded" if status.state == SUCCEEDED else "failed"


def _where(status_url: str, job_id: str) -> str:
    return f"GET {status_url or f'/v1/extraction-jobs/{job_id}'}"


def message_for(outcome: Outcome, status: JobStatus | None, job_id: str, **context: Any) -> str:
    where = _where(status.status_url if status else context.get("status_url", ""), job_id)
    if outcome == "succeeded":
        assert status is not None
        by = " after a reviewer's approval" if status.raw.get("decided_by") == "reviewer" else ""
        return (
            f"COMPLETE: extraction job {job_id} SUCCEEDED{by}. The validated invoice is in `result`. "
            "This is the job's final answer; do not submit the document again."
        )
    if outcome == "review_required":
        assert status is not None
        reasons = ", ".join(reason_codes(status.review)) or "see `review.reasons`"
        return (
            f"NOT complete: extraction job {job_id} waits for a human reviewer (REVIEW_REQUIRED). The "
            f"extraction did NOT pass validation ({reasons}); do not use it or report it as a result. "
            "A reviewer approves it (SUCCEEDED) or rejects it (REJECTED), which can take hours. Do not "
            f"submit the document again; check the job later with {where} (check_invoice_job), no "
            f"sooner than {REVIEW_CHECK_SECONDS} seconds from now."
        )
    if outcome == "failed":
        assert status is not None
        error = status.error or {}
        why = f" ({error.get('class', 'unknown')}: {error.get('message', '')})" if error else ""
        ended = {CANCELLED: "was CANCELLED", REJECTED: "was REJECTED by a reviewer"}.get(
            status.state, f"ended {status.state}"
        )
        return (
            f"FAILED: extraction job {job_id} {ended} without a result{why}. No result exists; do not "
            "report success."
        )
    state = status.state if status else context.get("state") or "unknown"
    return (
        f"NOT complete: extraction job {job_id} is still {state} after waiting "
        f"{context.get('waited', 0):.0f} s (the limit was {context.get('max_wait', 0):g} s). It continues "
        "in the background; this is not a failure, and no result exists yet. Do not report success and "
        f"do not submit the document again. Check it later with {where} (check_invoice_job) after at "
        f"least {context.get('next_check', 0)} seconds."
    )


def reason_codes(review: dict[str, Any] | None) -> list[str]:
    reasons = (review or {}).get("reasons") or []
    codes = [r.get("code") for r in reasons if isinstance(r, dict)]
    return sorted({c for c in codes if isinstance(c, str)})


class Waiter:
    """One wait for one job. ``start`` and each ``observe`` return seconds to sleep before the next
    poll, or the ``AwaitResult`` that ends the wait."""

    def __init__(
        self,
        job_id: str,
        *,
        max_wait: float,
        policy: PollPolicy | None = None,
        clock: Callable[[], float],
        rng: random.Random | None = None,
    ) -> None:
        if max_wait < 0:
            raise ValueError("max_wait must not be negative")
        self.job_id = job_id
        self.max_wait = max_wait
        self.policy = policy or PollPolicy()
        self.polls = 0
        self.failures = 0
        self.last: JobStatus | None = None
        self._clock = clock
        self._rng = rng or random.Random()
        self._started = clock()
        self._deadline = self._started + max_wait
        self._base: float | None = None
        self._state: str | None = None
        self._state_version: int | None = None
        self._status_url = ""
        self._replayed = False

    def start(self, accepted: Accepted | None = None) -> float | AwaitResult:
        """After the 202 (or at once, for a job submitted earlier: ``accepted`` None)."""
        if accepted is None:
            return 0.0
        self._state, self._state_version = accepted.state, accepted.state_version
        self._status_url, self._replayed = accepted.status_url, accepted.replayed
        if accepted.done or accepted.state == REVIEW_REQUIRED:
            return 0.0  # a replay of a job that has ended: read its result now
        return self._next(accepted.poll_after_seconds)

    def observe(self, status: JobStatus) -> float | AwaitResult:
        self.polls += 1
        self.last = status
        self._state, self._state_version, self._status_url = (
            status.state,
            status.state_version,
            status.status_url,
        )
        outcome = outcome_of(status)
        if outcome is not None:
            return self._result(outcome, status)
        return self._next(status.poll_after_seconds)

    def observe_failure(self, error: FaturaError) -> float | AwaitResult:
        """A poll that got no status (the edge unreachable, 503): keep waiting, backing off."""
        self.failures += 1
        retry_after = getattr(error, "retry_after", None)
        return self._next(int(retry_after) if isinstance(retry_after, int | float) else None)

    def _next(self, hint: int | None) -> float | AwaitResult:
        self._base, sleep = self.policy.next_delay(self._base, hint, self._rng)
        remaining = self._deadline - self._clock()
        if remaining <= 1e-3:
            return self.timed_out()
        return min(sleep, remaining)

    def timed_out(self) -> AwaitResult:
        base, _ = self.policy.next_delay(
            self._base, self.last.poll_after_seconds if self.last else None, self._rng
        )
        next_check = max(1, round(base))
        waited = self._clock() - self._started
        message = message_for(
            "timed_out",
            self.last,
            self.job_id,
            state=self._state,
            waited=waited,
            max_wait=self.max_wait,
            next_check=next_check,
            status_url=self._status_url,
        )
        return AwaitResult(
            outcome="timed_out",
            job_id=self.job_id,
            state=self._state,
            done=False,
            message=message,
            state_version=self._state_version,
            status_url=self._status_url,
            poll_after_seconds=next_check,
            waited_seconds=waited,
            polls=self.polls,
            replayed=self._replayed,
            status=self.last,
        )

    def _result(self, outcome: Outcome, status: JobStatus) -> AwaitResult:
        return AwaitResult(
            outcome=outcome,
            job_id=self.job_id,
            state=status.state,
            done=status.done,
            message=message_for(outcome, status, self.job_id),
            state_version=status.state_version,
            status_url=status.status_url,
            result=status.result if outcome == "succeeded" else None,
            error=status.error if outcome == "failed" else None,
            review=status.review if outcome in ("review_required", "failed") else None,
            poll_after_seconds=REVIEW_CHECK_SECONDS if outcome == "review_required" else None,
            waited_seconds=self._clock() - self._started,
            polls=self.polls,
            replayed=self._replayed,
            status=status,
        )
