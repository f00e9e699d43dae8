"""The relay's housekeeping deletes job events past FATURA_EVENT_RETENTION_HOURS and moves the horizon
over them in the same statement, so a stream resuming from before it knows what it missed is gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fix_db import drop_database
from fix_events import change_state, new_job
from services.acceptance.retention import prune_job_events
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.db import SyncPool, sync_pool
from services.common.migrate import migrate
from services.common.settings import CommonSettings

DAY = 86_400.0


@pytest.fixture
def scratch(database_url: str) -> Iterator[SyncPool]:
    """A database of its own: pruning runs from the oldest event of the whole log."""
    url = database_url + "_retention"
    drop_database(url)
    migrate(url)
    with sync_pool(CommonSettings(database_url=url), name="retention", max_size=2) as pool:
        yield pool
    drop_database(url)


def _seqs(pool: SyncPool) -> list[int]:
    with pool.connection() as conn:
        return [int(r["seq"]) for r in conn.execute("SELECT seq FROM job_events ORDER BY seq").fetchall()]


def _horizon(pool: SyncPool) -> int:
    with pool.connection() as conn:
        row = conn.execute("SELECT pruned_through FROM job_event_horizon").fetchone()
    assert row is not None
    return int(row["pruned_through"])


def test_events_past_the_retention_are_deleted_oldest_first_and_the_horizon_follows(
    scratch: SyncPool,
) -> None:
    tenant_id, _ = create_tenant(scratch, TenantSpec(name="retention"))
    old = new_job(scratch, tenant_id)
    change_state(scratch, tenant_id, old, "RUNNING")
    new_job(scratch, tenant_id)
    change_state(scratch, tenant_id, old, "SUCCEEDED")  # an old job's latest event is young
    first, second, third, fourth = _seqs(scratch)
    with scratch.connection() as conn:
        conn.execute(
            "UPDATE job_events SET at = now() - interval '40 days' WHERE seq IN (%s, %s)", (first, second)
        )
    # When the relay prunes with a 30-day retention
    deleted = prune_job_events(scratch, 30 * DAY, batch=2)
    # Then the two old events are gone, the horizon is at the last of them, the young ones stay
    assert deleted == 2
    assert _seqs(scratch) == [third, fourth]
    assert _horizon(scratch) == second
    # And a second pass finds nothing more to do
    assert prune_job_events(scratch, 30 * DAY) == 0
    assert _horizon(scratch) == second


def test_pruning_stops_at_the_first_event_still_within_the_retention(scratch: SyncPool) -> None:
    tenant_id, _ = create_tenant(scratch, TenantSpec(name="retention"))
    job = new_job(scratch, tenant_id)
    change_state(scratch, tenant_id, job, "RUNNING")
    change_state(scratch, tenant_id, job, "SUCCEEDED")
    first, second, third = _seqs(scratch)
    # An old event behind a young one is kept until the young one's time comes
    with scratch.connection() as conn:
        conn.execute(
            "UPDATE job_events SET at = now() - interval '40 days' WHERE seq IN (%s, %s)", (first, third)
        )
    assert prune_job_events(scratch, 30 * DAY) == 1
    assert _seqs(scratch) == [second, third]
    assert _horizon(scratch) == first
