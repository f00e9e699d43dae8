"""The per-worker admission view: fresh for a moment, charged with the worker's own acceptances."""

from __future__ import annotations

import time
import uuid

from services.acceptance.accept import UsageCache
from services.acceptance.admission import JobCost, Usage

TENANT = uuid.uuid4()
USAGE = Usage(
    pending_jobs=5, pending_bytes=500, pending_tokens=5000, tokens_today=7000, system_pending_jobs=50
)


def test_a_remembered_view_is_used_until_it_is_older_than_its_ttl() -> None:
    cache = UsageCache(ttl_seconds=0.05)
    assert cache.recent(TENANT) is None
    cache.remember(TENANT, USAGE)
    assert cache.recent(TENANT) == USAGE
    time.sleep(0.06)
    assert cache.recent(TENANT) is None


def test_the_workers_own_acceptances_are_added_to_its_view() -> None:
    cache = UsageCache(ttl_seconds=10)
    cache.remember(TENANT, USAGE)
    cache.charge(TENANT, JobCost(bytes=100, tokens=1000))
    assert cache.recent(TENANT) == Usage(
        pending_jobs=6, pending_bytes=600, pending_tokens=6000, tokens_today=8000, system_pending_jobs=51
    )


def test_a_zero_ttl_turns_the_cache_off() -> None:
    cache = UsageCache(ttl_seconds=0)
    cache.remember(TENANT, USAGE)
    assert cache.recent(TENANT) is None
