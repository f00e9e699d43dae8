"""The delivery scheduler's backlog gauges on real PostgreSQL: what KEDA scales the delivery workers
on (deploy/k8s) counts the deliveries that are due, not those waiting out a retry delay."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from fix_db import MakeTenant, SyncPool
from fix_delivery import insert_secret
from services.common.queries import load_queries
from services.delivery import signing, store

Q = load_queries(Path(store.__file__).with_name("sql") / "delivery.sql")


def _backlog(pool: SyncPool) -> dict[str, Any]:
    with pool.connection() as conn:
        row = conn.execute(Q["backlog"]).fetchone()
    assert row is not None
    return dict(row)


def test_a_delivery_waiting_for_its_retry_is_pending_but_not_due(
    pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant_id = make_tenant().id
    endpoint_id = uuid.uuid4()
    before = _backlog(pool)
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types)
               VALUES (%s, %s, 'http://127.0.0.1:9/hook', '{extraction.completed.v1}')""",
            (endpoint_id, tenant_id),
        )
        insert_secret(conn, endpoint_id, signing.new_secret())
        for retry_in_seconds in (0, 3600):
            event_id = uuid.uuid4()
            conn.execute(
                """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, body,
                                          next_attempt_at)
                   VALUES (%s, %s, 'extraction.completed.v1', %s, %s, '{}'::bytea,
                           now() + make_interval(secs => %s))""",
                (
                    signing.delivery_id(event_id, endpoint_id),
                    event_id,
                    endpoint_id,
                    tenant_id,
                    retry_in_seconds,
                ),
            )
    after = _backlog(pool)
    assert after["pending"] - before["pending"] == 2
    assert after["due"] - before["due"] == 1
