"""A database role per service (migration 0007): each process's sessions act as its role and hold
only its grants. Delivery reads webhook secrets to sign; the edge writes them and reads them sealed
to verify an ERP's acknowledgement (0012); inference and the relay cannot read them; the triggers
that keep counters need no grant from the role that fires them.

The end-to-end tests (tests/delivery, tests/integration/test_inference_pipeline.py) run every
process with its role on, the default, so they prove the grants suffice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import DictRow

from fix_db import MakeTenant, drop_database
from fix_processes import SpawnFn
from services.common.db import connect, session_kwargs
from services.common.migrate import migrate
from services.common.procs import free_port
from services.common.settings import CommonSettings

ROLES = ("fatura_edge", "fatura_relay", "fatura_inference", "fatura_delivery")
# Tables no service touches: only migrations and the CLI (the owner) do.
ADMIN_ONLY = {"schema_migrations", "job_state_transitions"}


def _as(database_url: str, db_role: str | None) -> psycopg.Connection[DictRow]:
    return connect(CommonSettings(database_url=database_url), autocommit=True, db_role=db_role)


def test_a_service_session_acts_as_its_role_and_fatura_db_roles_0_turns_it_off(database_url: str) -> None:
    with _as(database_url, "fatura_inference") as conn:
        assert conn.execute("SELECT current_user AS u").fetchone() == {"u": "fatura_inference"}
    off = CommonSettings.from_env({"FATURA_DATABASE_URL": database_url, "FATURA_DB_ROLES": "0"})
    with connect(off, db_role="fatura_inference") as conn:
        assert conn.execute("SELECT current_user AS u").fetchone() != {"u": "fatura_inference"}
    with pytest.raises(ValueError, match="not a service's database role"):
        session_kwargs("x", "worker", db_role="postgres -c role=x")


@pytest.mark.parametrize("role", ["fatura_inference", "fatura_relay"])
def test_inference_and_the_relay_cannot_read_webhook_secrets_at_all(database_url: str, role: str) -> None:
    with _as(database_url, role) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT * FROM webhook_secrets")


def test_the_edge_reads_sealed_secrets_to_verify_acknowledgements_but_changes_none(database_url: str) -> None:
    # The ERP's acknowledgement is signed with its endpoint's secret (migration 0012): the edge
    # opens the sealed secret to verify it, and can still only add secrets and end them.
    with _as(database_url, "fatura_edge") as conn:
        conn.execute(
            """SELECT endpoint_id, key_id, created_at, not_after, master_key_id, nonce, ciphertext
               FROM webhook_secrets LIMIT 1"""
        )
        for column in ("ciphertext", "nonce", "master_key_id", "key_id"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(
                    sql.SQL("UPDATE webhook_secrets SET {0} = {0} WHERE false").format(sql.Identifier(column))
                )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM webhook_secrets WHERE false")


def test_delivery_reads_sealed_secrets_to_sign_and_no_api_key(database_url: str) -> None:
    with _as(database_url, "fatura_delivery") as conn:
        conn.execute("SELECT endpoint_id, key_id, master_key_id, nonce, ciphertext FROM webhook_secrets")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM api_keys")


def test_a_role_changes_a_jobs_state_without_any_grant_on_the_counters_the_triggers_keep(
    database_url: str, make_tenant: MakeTenant
) -> None:
    # Given a READY job accepted by the edge's role (the pending counters go up)
    tenant = make_tenant()
    job_id, doc_id = uuid.uuid4(), uuid.uuid4()
    with _as(database_url, "fatura_edge") as edge:
        edge.execute(
            """INSERT INTO documents (tenant_id, id, version, sha256, size_bytes, text)
               VALUES (%s, %s, 1, 'x', 10, 'text')""",
            (tenant.id, doc_id),
        )
        edge.execute(
            """INSERT INTO extraction_jobs (id, tenant_id, idempotency_key, request_hash, document_id,
                   document_version, object_version, doc_bytes, estimated_tokens, schema_version,
                   policy_version, model_policy, priority, state, deadline_at)
               VALUES (%s, %s, %s, 'h', %s, 1, 'x', 10, 100, 'invoice.v1', 'p1', 'default', 'batch',
                       'READY', now() + interval '1 hour')""",
            (job_id, tenant.id, f"k-{job_id}", doc_id),
        )
    # When inference runs and fails it (the state machine and the counters are trigger work)
    with _as(database_url, "fatura_inference") as inference:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            inference.execute("SELECT * FROM admission_counters")
        inference.execute("UPDATE extraction_jobs SET state = 'RUNNING' WHERE id = %s", (job_id,))
        inference.execute("UPDATE extraction_jobs SET state = 'FAILED_TERMINAL' WHERE id = %s", (job_id,))
        # Then an illegal transition is still refused, by the same trigger
        with pytest.raises(psycopg.errors.CheckViolation):
            inference.execute("UPDATE extraction_jobs SET state = 'READY' WHERE id = %s", (job_id,))
    with _as(database_url, None) as admin:
        row = admin.execute(
            "SELECT coalesce(sum(pending_jobs), 0) AS n FROM admission_counters WHERE scope = %s",
            (tenant.id,),
        ).fetchone()
    assert row == {"n": 0}


def test_every_table_is_granted_to_the_services_that_use_it_or_is_the_owners_alone(database_url: str) -> None:
    """A migration that adds a table grants it to the roles that use it (see 0007's header)."""
    with _as(database_url, None) as conn:
        rows = conn.execute(
            """SELECT c.relname AS table,
                      array_agg(r.rolname ORDER BY r.rolname)
                          FILTER (WHERE has_table_privilege(r.oid, c.oid, 'SELECT, INSERT, UPDATE, DELETE')
                                  OR has_any_column_privilege(r.oid, c.oid, 'SELECT, INSERT, UPDATE'))
                          AS roles
               FROM pg_class c
               CROSS JOIN pg_roles r
               WHERE c.relkind = 'r' AND c.relnamespace = current_schema()::regnamespace
                 AND r.rolname = ANY (%s)
               GROUP BY c.relname""",
            (list(ROLES),),
        ).fetchall()
    ungranted = {r["table"] for r in rows if r["roles"] is None}
    assert ungranted == ADMIN_ONLY, (
        f"tables no service role may use: {sorted(ungranted - ADMIN_ONLY)}; grant them in their migration"
    )


@pytest.fixture
def scratch_url(database_url: str) -> Iterator[str]:
    url = database_url + "_roles"
    drop_database(url)
    migrate(url)
    yield url
    drop_database(url)


def test_a_service_process_holds_only_its_roles_grants(scratch_url: str, spawn: SpawnFn) -> None:
    # Given a database where the relay's role may no longer mark events published
    with psycopg.connect(scratch_url, autocommit=True) as admin:
        admin.execute("REVOKE UPDATE ON outbox_events FROM fatura_relay")
    # When the relay runs against it
    relay = spawn(
        "relay",
        FATURA_DATABASE_URL=scratch_url,
        FATURA_RELAY_METRICS_PORT=str(free_port()),
        FATURA_QUEUE_PREFIX=f"roles{uuid.uuid4().hex[:6]}",
    )
    try:
        # Then its claims are refused by PostgreSQL: it acts as fatura_relay, not as its login user
        deadline = time.monotonic() + 30
        while "permission denied for table outbox_events" not in relay.log():
            assert relay.alive() and time.monotonic() < deadline, relay.log()
            time.sleep(0.2)
    finally:
        relay.stop()
