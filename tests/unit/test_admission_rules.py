"""Admission as a pure decision: which limit refuses, with what status and Retry-After."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.acceptance.admission import (
    JobCost,
    TenantLimits,
    Usage,
    comfortably_within,
    decide,
    estimate_tokens,
    seconds_until_next_utc_day,
)

LIMITS = TenantLimits(
    max_pending_jobs=10, max_pending_bytes=10_000, max_pending_tokens=100_000, daily_token_budget=1_000_000
)
NOW = datetime(2026, 11, 30, 23, 59, 0, tzinfo=UTC)
COST = JobCost(bytes=1000, tokens=3000)


def _usage(**overrides: int) -> Usage:
    base = {
        "pending_jobs": 0,
        "pending_bytes": 0,
        "pending_tokens": 0,
        "tokens_today": 0,
        "system_pending_jobs": 0,
    }
    return Usage(**{**base, **overrides})


def _decide(usage: Usage, cost: JobCost = COST, backlog: int = 1000):  # type: ignore[no-untyped-def]
    return decide(
        LIMITS, usage, cost, max_system_backlog=backlog, now=NOW, quota_retry_after=30, backlog_retry_after=60
    )


def test_a_job_within_every_limit_is_admitted() -> None:
    assert _decide(_usage(pending_jobs=9, pending_bytes=9000, pending_tokens=97_000)) is None


@pytest.mark.parametrize(
    ("usage", "limit"),
    [
        (_usage(pending_jobs=10), "pending_jobs"),
        (_usage(pending_bytes=9001), "pending_bytes"),
        (_usage(pending_tokens=97_001), "pending_tokens"),
    ],
)
def test_each_tenant_limit_refuses_with_429_and_the_quota_retry_after(usage: Usage, limit: str) -> None:
    rejection = _decide(usage)
    assert rejection is not None
    assert (rejection.status, rejection.limit, rejection.retry_after_seconds) == (429, limit, 30)


def test_the_daily_budget_refuses_until_the_next_utc_midnight() -> None:
    rejection = _decide(_usage(tokens_today=998_000))
    assert rejection is not None
    assert (rejection.status, rejection.limit) == (429, "daily_token_budget")
    assert rejection.retry_after_seconds == 60  # 23:59:00 -> 00:00:00


def test_a_full_system_refuses_with_503_before_any_tenant_limit() -> None:
    rejection = _decide(_usage(pending_jobs=10, system_pending_jobs=1000))
    assert rejection is not None
    assert (rejection.status, rejection.limit, rejection.retry_after_seconds) == (503, "system_backlog", 60)


def test_a_zero_cap_refuses_everything() -> None:
    rejection = _decide(_usage(), backlog=0)
    assert rejection is not None and rejection.status == 503


def test_token_estimate_is_input_plus_prompt_plus_output_cap() -> None:
    assert estimate_tokens(4000, prompt_overhead=600, max_output=2048) == 1000 + 600 + 2048
    assert estimate_tokens(1, prompt_overhead=0, max_output=0) == 1


def test_seconds_until_midnight_is_never_zero() -> None:
    assert seconds_until_next_utc_day(datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)) == 86_400
    assert seconds_until_next_utc_day(datetime(2026, 1, 1, 23, 59, 59, 999_999, tzinfo=UTC)) == 1


def test_a_worker_may_skip_the_read_only_far_from_every_limit() -> None:
    far = _usage(pending_jobs=1, pending_bytes=1000, pending_tokens=10_000, system_pending_jobs=10)
    assert comfortably_within(LIMITS, far, COST, max_system_backlog=1000, headroom_jobs=0)
    for near in (
        _usage(pending_jobs=9),
        _usage(pending_bytes=8001),
        _usage(pending_tokens=87_001),
        _usage(tokens_today=897_001),
        _usage(system_pending_jobs=900),
    ):
        assert not comfortably_within(LIMITS, near, COST, max_system_backlog=1000, headroom_jobs=0), near


def test_a_limit_with_no_room_for_the_headroom_is_always_decided_afresh() -> None:
    # The job leaves every limit below 90%, with room for 2 more like it but not for 9
    far = _usage(pending_jobs=1, pending_bytes=1000, pending_tokens=10_000, system_pending_jobs=10)
    assert comfortably_within(LIMITS, far, COST, max_system_backlog=1000, headroom_jobs=2)
    assert not comfortably_within(LIMITS, far, COST, max_system_backlog=1000, headroom_jobs=9)
    # A tenant allowed a few pending jobs never takes the fast path with the default headroom
    assert not comfortably_within(LIMITS, _usage(), COST, max_system_backlog=10**6)
    roomy = TenantLimits(
        max_pending_jobs=20_000, max_pending_bytes=10**9, max_pending_tokens=10**9, daily_token_budget=10**10
    )
    assert comfortably_within(roomy, _usage(), COST, max_system_backlog=10**6)
