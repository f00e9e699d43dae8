"""The job state machine of DESIGN §3, as plain data and functions."""

from __future__ import annotations

READY = "READY"
RUNNING = "RUNNING"
RETRY_SCHEDULED = "RETRY_SCHEDULED"
SUCCEEDED = "SUCCEEDED"
REVIEW_REQUIRED = "REVIEW_REQUIRED"
FAILED_TERMINAL = "FAILED_TERMINAL"
CANCELLED = "CANCELLED"
REJECTED = "REJECTED"

# The machine still has work to do.
NON_TERMINAL = frozenset({READY, RUNNING, RETRY_SCHEDULED})
# The machine is finished and a human decides: approve or correct (SUCCEEDED) or reject (REJECTED).
AWAITING_REVIEW = frozenset({REVIEW_REQUIRED})
# Final: never changes again.
FINAL = frozenset({SUCCEEDED, FAILED_TERMINAL, CANCELLED, REJECTED})
# No machine work is left: what a burst drains to.
TERMINAL = FINAL | AWAITING_REVIEW
ALL = NON_TERMINAL | TERMINAL

# Allowed transitions. Final states never change again; any non-terminal state may be cancelled by
# the tenant or failed terminally (deadline passed, retry budget spent); a job awaiting review
# leaves it only by a reviewer's decision (DESIGN §5.13).
TRANSITIONS: dict[str, frozenset[str]] = {
    READY: frozenset({RUNNING, CANCELLED, FAILED_TERMINAL}),
    RUNNING: frozenset({SUCCEEDED, REVIEW_REQUIRED, RETRY_SCHEDULED, FAILED_TERMINAL, CANCELLED}),
    RETRY_SCHEDULED: frozenset({RUNNING, CANCELLED, FAILED_TERMINAL}),
    SUCCEEDED: frozenset(),
    REVIEW_REQUIRED: frozenset({SUCCEEDED, REJECTED}),
    FAILED_TERMINAL: frozenset(),
    CANCELLED: frozenset(),
    REJECTED: frozenset(),
}


def is_done(state: str) -> bool:
    """The job has its final answer: a client may stop waiting. A job awaiting review is not done."""
    return state in FINAL


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())
