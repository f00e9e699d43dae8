"""PostgreSQL goes away under an open event stream (DESIGN §5.12): the edge's feed reconnects with
backoff and reads on from its watermark, the stream stays open, and its client misses no event.

The edge reaches PostgreSQL through the project's TCP fault proxy, which resets every connection
and refuses new ones for the window; the test writes its events straight to PostgreSQL meanwhile.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from fix_db import MakeTenant, SyncPool
from fix_events import change_state, new_job, sse
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.chaos.proxy import FaultProxy

pytestmark = pytest.mark.chaos

CUT_SECONDS = 4.0


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture(scope="module")
def pg_proxy() -> Iterator[FaultProxy]:
    proxy = FaultProxy("postgresql", "127.0.0.1", 5432)
    proxy.start()
    yield proxy
    proxy.close()


@pytest.fixture(scope="module")
def proxied_edge(spawn: SpawnFn, database_url: str, pg_proxy: FaultProxy) -> ServiceProcess:
    return start_edge(
        spawn,
        workers=1,
        FATURA_DATABASE_URL=_via(database_url, pg_proxy.port),
        FATURA_EVENT_POLL_SECONDS="0.05",
        FATURA_EVENT_HEARTBEAT_SECONDS="0.5",
    )


def _tenant_events(pool: SyncPool, tenant_id: uuid.UUID, after: int) -> list[tuple[int, str, int]]:
    with pool.connection() as conn:
        rows = conn.execute(
            """SELECT seq, job_id::text AS job_id, state_version FROM job_events
               WHERE tenant_id = %s AND seq > %s ORDER BY seq""",
            (tenant_id, after),
        ).fetchall()
    return [(int(r["seq"]), r["job_id"], int(r["state_version"])) for r in rows]


def test_a_postgresql_cut_under_an_open_stream_loses_no_event(
    proxied_edge: ServiceProcess, pg_proxy: FaultProxy, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    assert proxied_edge.base_url is not None
    tenant = make_tenant()
    with sse(proxied_edge.base_url, "/v1/events", tenant.api_key) as stream:
        assert stream.next().data["jobs"] == []
        jobs = [new_job(pool, tenant.id) for _ in range(3)]
        change_state(pool, tenant.id, jobs[0], "RUNNING")
        received = stream.take(4)
        # When every connection of the edge to PostgreSQL is reset and new ones refused for a while,
        # and jobs change meanwhile
        pg_proxy.cut(CUT_SECONDS)
        for job in jobs[1:]:
            change_state(pool, tenant.id, job, "RUNNING")
        change_state(pool, tenant.id, jobs[0], "SUCCEEDED")
        time.sleep(CUT_SECONDS / 2)
        # Then the stream stays open meanwhile (heartbeats), and after the cut every event arrives
        for job in jobs[1:]:
            change_state(pool, tenant.id, job, "SUCCEEDED")
        expected = _tenant_events(pool, tenant.id, after=0)
        while len(received) < len(expected):
            received.append(stream.next(timeout=CUT_SECONDS + 15))
        assert stream.comments >= 2
    assert [(int(e.id or 0), e.data["job_id"], e.data["state_version"]) for e in received] == expected
    assert proxied_edge.alive(), proxied_edge.log_tail()
    assert "event feed lost the database" in proxied_edge.log()
