"""The admission counters (migration 0027) and a batch's item counts (0028) are written when a
job's transaction commits, so a transaction that changed a job and is still open (a slot's completion
waiting on the limiter for its next claim) holds up no other acceptance or completion counted on the
same shard."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack

import psycopg
import pytest
from psycopg.rows import dict_row

from fix_db import MakeTenant, accept_by_statement

SHARDS = 16  # fatura_count_pending's shard: the backend's pid modulo 16


@pytest.fixture
def same_shard(database_url: str) -> Iterator[tuple[psycopg.Connection[dict[str, object]], ...]]:
    """Two autocommit connections whose backends count on the same shard (of 17, two must)."""
    with ExitStack() as stack:
        by_shard: dict[int, psycopg.Connection[dict[str, object]]] = {}
        for _ in range(SHARDS + 1):
            conn = stack.enter_context(psycopg.connect(database_url, row_factory=dict_row, autocommit=True))
            shard = conn.info.backend_pid % SHARDS
            if shard in by_shard:
                yield by_shard[shard], conn
                return
            by_shard[shard] = conn
        raise AssertionError("17 backends on 16 shards: two must share one")


def pending(conn: psycopg.Connection[dict[str, object]], tenant_id: uuid.UUID) -> int:
    row = conn.execute(
        "SELECT coalesce(sum(pending_jobs), 0) AS n FROM admission_counters WHERE scope = %s", (tenant_id,)
    ).fetchone()
    assert row is not None
    return int(str(row["n"]))


def test_an_open_state_change_holds_up_no_acceptance_on_its_shard_and_counts_at_commit(
    same_shard: tuple[psycopg.Connection[dict[str, object]], ...], make_tenant: MakeTenant
) -> None:
    """Given two backends on one counter shard and a tenant with an accepted job
    When the first cancels the job in a transaction it keeps open, and the second accepts a job
    of the same tenant (waiting at most 2 s for any lock)
    Then the acceptance goes through at once, the cancellation is not counted until its commit,
    and after the commit the counters hold exactly the one pending job."""
    first, second = same_shard
    tenant = make_tenant()
    cancelled = accept_by_statement(first, tenant.id, "first")
    assert pending(second, tenant.id) == 1
    second.execute("SET lock_timeout = '2s'")
    with first.transaction():
        first.execute(
            "UPDATE extraction_jobs SET state = 'CANCELLED', state_version = state_version + 1, "
            "finished_at = now() WHERE id = %s",
            (cancelled,),
        )
        accept_by_statement(
            second, tenant.id, "second"
        )  # before 0027: LockNotAvailable after 2 s (the shard rows held)
        assert pending(second, tenant.id) == 2, "the open cancellation is not counted yet"
    assert pending(second, tenant.id) == 1


def test_a_state_change_rolled_back_counts_nothing(
    same_shard: tuple[psycopg.Connection[dict[str, object]], ...], make_tenant: MakeTenant
) -> None:
    first, second = same_shard
    tenant = make_tenant()
    job = accept_by_statement(first, tenant.id, "only")
    with pytest.raises(RuntimeError), first.transaction():
        first.execute("UPDATE extraction_jobs SET state = 'CANCELLED' WHERE id = %s", (job,))
        raise RuntimeError("rolled back")
    assert pending(second, tenant.id) == 1


def test_open_item_changes_hold_up_no_other_item_of_the_batch_and_the_last_commit_closes_it(
    same_shard: tuple[psycopg.Connection[dict[str, object]], ...], make_tenant: MakeTenant
) -> None:
    """Given a running batch of two items and two backends on one counter shard
    When the first cancels item 0 in a transaction it keeps open, and the second cancels item 1
    (waiting at most 2 s for any lock), then the first commits
    Then the second's change goes through at once without closing the batch (item 0 is not final
    for it yet), and the first's commit counts item 0 and closes the batch with one event."""
    first, second = same_shard
    tenant = make_tenant()
    batch_id = uuid.uuid4()
    first.execute(
        "INSERT INTO extraction_batches (id, tenant_id, idempotency_key, request_hash, total, accepted, "
        "priority, state) VALUES (%s, %s, %s, 'h', 2, 2, 'batch', 'running')",
        (batch_id, tenant.id, f"batch-{batch_id}"),
    )
    items = [accept_by_statement(first, tenant.id, f"item-{i}", batch=(batch_id, i)) for i in range(2)]
    cancel = "UPDATE extraction_jobs SET state = 'CANCELLED', state_version = state_version + 1 WHERE id = %s"
    second.execute("SET lock_timeout = '2s'")
    with first.transaction():
        first.execute(cancel, (items[0],))
        second.execute(cancel, (items[1],))  # before 0028: LockNotAvailable after 2 s
        assert batch_state(second, batch_id) == ("running", 0)
    assert batch_state(second, batch_id) == ("completed_with_errors", 1)
    row = second.execute(
        "SELECT coalesce(sum(cancelled), 0) AS n FROM batch_counters WHERE batch_id = %s", (batch_id,)
    ).fetchone()
    assert row is not None and row["n"] == 2


def batch_state(conn: psycopg.Connection[dict[str, object]], batch_id: uuid.UUID) -> tuple[str, int]:
    """The batch's state, and how many batch.completed.v1 events name it."""
    row = conn.execute(
        "SELECT b.state, (SELECT count(*) FROM outbox_events o WHERE o.event_type = 'batch.completed.v1' "
        "AND o.payload->>'batch_id' = b.id::text) AS events FROM extraction_batches b WHERE b.id = %s",
        (batch_id,),
    ).fetchone()
    assert row is not None
    return str(row["state"]), int(str(row["events"]))
