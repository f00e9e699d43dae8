"""The job state machine of DESIGN §3, as plain data and functions."""

from __future__ import annotations

READY = "READY"
RUNNING = "RUNNING"
RETRY_SCHEDULED = "RETRY_SCHEDULED"
SUCCEEDED = "SUCCEEDED"
REVIEW_REQUIRED = "REVIEW_REQUIRED"
FAILED_TERMINAL = "FAILED_TERMINAL"
CANCELLED = "CANCELLED"

NON_TERMINAL = frozenset({READY, RUNNING, RETRY_SCHEDULED})
TERMINAL = frozenset({SUCCEEDED, REVIEW_REQUIRED, FAILED_TERMINAL, CANCELLED})
ALL = NON_TERMINAL | TERMINAL

# Allowed transitions. Terminal states never change again; any non-terminal state may be cancelled
# by the tenant or failed terminally (deadline passed, retry budget spent).
TRANSITIONS: dict[str, frozenset[str]] = {
    READY: frozenset({RUNNING, CANCELLED, FAILED_TERMINAL}),
    RUNNING: frozenset({SUCCEEDED, REVIEW_REQUIRED, RETRY_SCHEDULED, FAILED_TERMINAL, CANCELLED}),
    RETRY_SCHEDULED: frozenset({RUNNING, CANCELLED, FAILED_TERMINAL}),
    SUCCEEDED: frozenset(),
    REVIEW_REQUIRED: frozenset(),
    FAILED_TERMINAL: frozenset(),
    CANCELLED: frozenset(),
}


def is_done(state: str) -> bool:
    return state in TERMINAL


def can_transition(current: str, target: str) -> bool:
    return target in TRANSITIONS.get(current, frozenset())
