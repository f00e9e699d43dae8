"""The job state machine of DESIGN §3 is enforced by the database, and the database's table of
allowed transitions is the one ``services.common.states`` describes."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from fix_db import MakeTenant, SyncPool
from services.common import states


def test_the_database_allows_exactly_the_transitions_of_the_state_machine(pool: SyncPool) -> None:
    with pool.connection() as conn:
        rows = conn.execute("SELECT from_state, to_state FROM job_state_transitions").fetchall()
    in_database = {(r["from_state"], r["to_state"]) for r in rows}
    in_code = {(a, b) for a, targets in states.TRANSITIONS.items() for b in targets}
    assert in_database == in_code


def _job(pool: SyncPool, tenant_id: uuid.UUID, state: str) -> uuid.UUID:
    job_id = uuid.uuid4()
    doc_id = uuid.uuid4()
    with pool.connection() as conn:
        conn.execute(
            "INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text)"
            " VALUES (%s, %s, 1, 'x', 1, 'x')",
            (tenant_id, doc_id),
        )
        conn.execute(
            """INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id,
                   document_version, object_version, doc_bytes, estimated_tokens, schema_version,
                   policy_version, model_policy, priority, state, available_at, deadline_at)
               VALUES (%s, %s, %s, 'h', %s, 1, 'v1', 1, 10, 'invoice.v1', 'p', 'default', 'batch', %s,
                   now(), now() + interval '1 day')""",
            (job_id, tenant_id, f"k-{job_id}", doc_id, state),
        )
    return job_id


@pytest.mark.parametrize(
    ("start", "target"),
    [(a, b) for a in sorted(states.ALL) for b in sorted(states.ALL) if a != b],
)
def test_every_state_change_is_allowed_or_refused_as_the_machine_says(
    pool: SyncPool, make_tenant: MakeTenant, start: str, target: str
) -> None:
    job_id = _job(pool, make_tenant().id, start)
    with pool.connection() as conn:
        if states.can_transition(start, target):
            conn.execute("UPDATE extraction_jobs SET state = %s WHERE id = %s", (target, job_id))
        else:
            with pytest.raises(psycopg.errors.CheckViolation, match="illegal job state transition"):
                conn.execute("UPDATE extraction_jobs SET state = %s WHERE id = %s", (target, job_id))
            conn.rollback()
        row = conn.execute("SELECT state FROM extraction_jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    assert row["state"] == (target if states.can_transition(start, target) else start)
