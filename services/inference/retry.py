"""The retry schedule of DESIGN §5.8, as pure functions.

Full jitter: ``delay = uniform(0, min(cap, base * 2**(attempt-1)))``, at least the provider's
Retry-After, at most ``max_attempts`` attempts, and none scheduled unless the next attempt plus a
margin fits before the job's deadline.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 5
    base_seconds: float = 2.0
    cap_seconds: float = 60.0
    attempt_seconds: float = 45.0  # what the next attempt may take
    margin_seconds: float = 5.0


@dataclass(frozen=True)
class RetryAt:
    at: datetime


@dataclass(frozen=True)
class GiveUp:
    reason: str  # "retry_budget_exhausted" | "deadline_exceeded"


def backoff_seconds(attempt: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """Full-jitter delay after the ``attempt``-th attempt (1-based)."""
    ceiling = min(policy.cap_seconds, policy.base_seconds * 2 ** max(0, attempt - 1))
    return (rng or random).uniform(0, ceiling)


def next_step(
    attempt: int,
    now: datetime,
    deadline_at: datetime,
    policy: RetryPolicy,
    retry_after_ms: int | None = None,
    rng: random.Random | None = None,
) -> RetryAt | GiveUp:
    """After ``attempt`` attempts have failed retryably: when to try again, or why not."""
    if attempt >= policy.max_attempts:
        return GiveUp("retry_budget_exhausted")
    delay = backoff_seconds(attempt, policy, rng)
    if retry_after_ms is not None:
        delay = max(delay, retry_after_ms / 1000)
    at = now + timedelta(seconds=delay)
    if at + timedelta(seconds=policy.attempt_seconds + policy.margin_seconds) > deadline_at:
        return GiveUp("deadline_exceeded")
    return RetryAt(at)
