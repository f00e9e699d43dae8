"""A group commit's inbox writes in one statement (services/common/inbox.py, take_all_and_check):
each event gets what ``take_and_check`` gives it alone, in order: new ones their check, one seen
before (or earlier in the same group) a duplicate, one whose id came with another payload quarantined;
each id is recorded once, with the payload that came first."""

from __future__ import annotations

import uuid
from typing import Any

from fix_db import accept_by_statement
from services.common import events, inbox
from services.common.db import SyncPool
from services.common.inbox import Received
from services.common.messages import EventMessage
from services.inference.worker import Q as WORKER_Q
from services.inference.worker import take_all_in, take_in


def _event(
    job_id: uuid.UUID, tenant_id: uuid.UUID, event_id: uuid.UUID | None = None, version: int = 1
) -> EventMessage:
    event_id = event_id or uuid.uuid4()
    payload: dict[str, Any] = {
        "event_id": str(event_id),
        "event_type": events.EXTRACTION_REQUESTED,
        "tenant_id": str(tenant_id),
        "job_id": str(job_id),
        "state": "READY",
        "state_version": version,
    }
    return EventMessage(event_id, events.EXTRACTION_REQUESTED, tenant_id, job_id, "READY", version, payload)


def _stored(pool: SyncPool, ids: list[uuid.UUID]) -> tuple[dict[uuid.UUID, str], list[tuple[uuid.UUID, str]]]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT event_id, payload_digest FROM execution_inbox WHERE event_id = ANY(%s)", (ids,)
        ).fetchall()
        quarantined = conn.execute(
            "SELECT event_id, received_digest FROM inbox_quarantine"
            " WHERE inbox = 'execution_inbox' AND event_id = ANY(%s) ORDER BY id",
            (ids,),
        ).fetchall()
    return {r["event_id"]: r["payload_digest"] for r in rows}, [
        (r["event_id"], r["received_digest"]) for r in quarantined
    ]


def test_a_groups_events_are_taken_in_by_one_statement_each_as_it_would_be_alone(
    pool: SyncPool, unpublished_tenant_id: uuid.UUID
) -> None:
    # Given a job that waits to be claimed, a job id nobody knows, and two events taken in before
    tenant = unpublished_tenant_id
    with pool.connection() as conn:
        waiting = accept_by_statement(conn, tenant, f"group-{uuid.uuid4()}")
    unknown = uuid.uuid4()
    seen, clashing = _event(unknown, tenant), _event(unknown, tenant)
    with pool.connection() as conn, conn.transaction():
        assert take_in(conn, seen)[0] is Received.NEW
        assert take_in(conn, clashing)[0] is Received.NEW
    # When a group arrives: two new events, one of them again (same payload) and once more with
    # another payload, the event seen before, and the clashing one with another payload
    first, second = _event(waiting, tenant), _event(unknown, tenant)
    group = [
        first,
        second,
        _event(waiting, tenant, first.event_id),
        _event(unknown, tenant, second.event_id, version=2),
        _event(unknown, tenant, seen.event_id),
        _event(unknown, tenant, clashing.event_id, version=3),
    ]
    with pool.connection() as conn, conn.transaction():
        results = take_all_in(conn, group)
    # Then each gets what it would alone: the new ones their check (only the waiting job waits)
    assert results == [
        (Received.NEW, True),
        (Received.NEW, False),
        (Received.DUPLICATE, False),
        (Received.QUARANTINED, False),
        (Received.DUPLICATE, False),
        (Received.QUARANTINED, False),
    ]
    # And each id is recorded once, with its first payload; the clashes are in quarantine
    ids = [first.event_id, second.event_id, seen.event_id, clashing.event_id]
    recorded, quarantined = _stored(pool, ids)
    assert recorded == {e.event_id: e.digest for e in (first, second, seen, clashing)}
    assert quarantined == [(second.event_id, group[3].digest), (clashing.event_id, group[5].digest)]


def test_a_check_reads_each_events_own_job(pool: SyncPool, unpublished_tenant_id: uuid.UUID) -> None:
    # Given three jobs that wait and a group of their events in another order, with unknown jobs between
    tenant = unpublished_tenant_id
    with pool.connection() as conn:
        jobs = [accept_by_statement(conn, tenant, f"check-{uuid.uuid4()}") for _ in range(3)]
    group = [
        _event(jobs[2], tenant),
        _event(uuid.uuid4(), tenant),
        _event(jobs[0], tenant),
        _event(jobs[1], tenant),
    ]
    # When the group is taken in by one statement
    with pool.connection() as conn, conn.transaction():
        results = inbox.take_all_and_check(conn, inbox.EXECUTION, group, WORKER_Q["job_waits"])
    # Then each event's check answered for its own job
    assert results == [
        (Received.NEW, True),
        (Received.NEW, False),
        (Received.NEW, True),
        (Received.NEW, True),
    ]
