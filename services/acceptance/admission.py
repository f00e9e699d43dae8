"""Admission: may one more job enter? A pure decision over counters read in O(1) (DESIGN §5.2).

Per tenant it checks pending jobs, pending bytes, pending estimated tokens and the day's token
budget (429); for the whole system, the runnable backlog (503). An already accepted job is never
affected: this runs only for new work.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from services.common.api.tenancy import TenantLimits


@dataclass(frozen=True)
class Usage:
    pending_jobs: int
    pending_bytes: int
    pending_tokens: int
    tokens_today: int
    system_pending_jobs: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Usage:
        """The counters of a row of ``admission_snapshot`` or ``admission_counters``."""
        return cls(
            pending_jobs=row["pending_jobs"],
            pending_bytes=row["pending_bytes"],
            pending_tokens=row["pending_tokens"],
            tokens_today=row["tokens_today"],
            system_pending_jobs=row["system_pending_jobs"],
        )


@dataclass(frozen=True)
class JobCost:
    bytes: int
    tokens: int


@dataclass(frozen=True)
class Rejection:
    status: int  # 429 (tenant quota) or 503 (system backlog)
    limit: str
    current: int
    maximum: int
    retry_after_seconds: int
    message: str


def estimate_tokens(text_bytes: int, *, prompt_overhead: int, max_output: int) -> int:
    """Token reservation for one job: a conservative input estimate plus the output cap.

    About four bytes of UTF-8 text per token is the usual rule for Latin scripts; it errs high for
    digits-heavy invoices, which is the safe side for a reservation.
    """
    return math.ceil(text_bytes / 4) + prompt_overhead + max_output


def seconds_until_next_utc_day(now: datetime) -> int:
    tomorrow = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max(1, math.ceil((tomorrow - now).total_seconds()))


def decide(
    limits: TenantLimits,
    usage: Usage,
    cost: JobCost,
    *,
    max_system_backlog: int,
    now: datetime,
    quota_retry_after: int,
    backlog_retry_after: int,
    jobs: int = 1,
) -> Rejection | None:
    """None when the work may be accepted, else the first limit it would break.

    ``jobs`` jobs of ``cost`` in all (a batch is decided as a whole: every job or none).
    """
    if usage.system_pending_jobs + jobs > max_system_backlog:
        return Rejection(
            503,
            "system_backlog",
            usage.system_pending_jobs,
            max_system_backlog,
            backlog_retry_after,
            "The system's runnable backlog is at capacity; no new work is being accepted right now. "
            f"Nothing was created. Retry after {backlog_retry_after} seconds.",
        )
    tenant_checks = (
        ("pending_jobs", usage.pending_jobs, jobs, limits.max_pending_jobs, "pending jobs"),
        (
            "pending_bytes",
            usage.pending_bytes,
            cost.bytes,
            limits.max_pending_bytes,
            "pending document bytes",
        ),
        (
            "pending_tokens",
            usage.pending_tokens,
            cost.tokens,
            limits.max_pending_tokens,
            "pending estimated tokens",
        ),
    )
    for limit, current, add, maximum, words in tenant_checks:
        if current + add > maximum:
            return Rejection(
                429,
                limit,
                current,
                maximum,
                quota_retry_after,
                f"Your {words} would exceed your limit ({current} + {add} > {maximum}). Nothing was "
                f"created. Retry after {quota_retry_after} seconds, when earlier jobs have finished.",
            )
    if usage.tokens_today + cost.tokens > limits.daily_token_budget:
        wait = seconds_until_next_utc_day(now)
        return Rejection(
            429,
            "daily_token_budget",
            usage.tokens_today,
            limits.daily_token_budget,
            wait,
            f"Today's token budget would be exceeded ({usage.tokens_today} + {cost.tokens} > "
            f"{limits.daily_token_budget}). Nothing was created. Retry after {wait} seconds, "
            "when the budget resets at 00:00 UTC.",
        )
    return None


# How many more jobs like this one must still fit for a worker to decide on counters it read a
# moment ago: more than the edge's workers can accept in the cache's lifetime (0.1 s by default).
FAST_PATH_HEADROOM_JOBS = 256


def comfortably_within(
    limits: TenantLimits,
    usage: Usage,
    cost: JobCost,
    *,
    max_system_backlog: int,
    margin: float = 0.9,
    headroom_jobs: int = FAST_PATH_HEADROOM_JOBS,
) -> bool:
    """True when the job would leave every limit below ``margin`` of its maximum, with room for
    ``headroom_jobs`` more like it besides.

    Only then may a worker decide on counters it read a moment ago: whatever other workers
    accepted since cannot plausibly close the remaining gap. A limit that is small next to the
    headroom (a tenant allowed a few pending jobs) is always decided afresh, under the tenant's
    admission lock, so it holds exactly.
    """
    n = 1 + headroom_jobs

    def fits(current: int, add: int, maximum: int) -> bool:
        return current + add <= margin * maximum and current + add * n <= maximum

    return (
        fits(usage.system_pending_jobs, 1, max_system_backlog)
        and fits(usage.pending_jobs, 1, limits.max_pending_jobs)
        and fits(usage.pending_bytes, cost.bytes, limits.max_pending_bytes)
        and fits(usage.pending_tokens, cost.tokens, limits.max_pending_tokens)
        and fits(usage.tokens_today, cost.tokens, limits.daily_token_budget)
    )
