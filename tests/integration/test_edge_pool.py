"""The edge's database pool (FATURA_EDGE_DB_POOL_MAX): a burst of concurrent submissions larger than
the pool waits for its few connections; every request is answered and every job written once."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from fix_api import job_body
from fix_db import MakeTenant, SyncPool
from fix_processes import ServiceProcess, SpawnFn, start_edge

BURST = 60


@pytest.fixture
def small_pool_edge(spawn: SpawnFn) -> Iterator[ServiceProcess]:
    edge = start_edge(spawn, workers=1, FATURA_EDGE_DB_POOL_MAX="2", FATURA_AUTH_CACHE_SECONDS="0")
    yield edge
    edge.stop()


def local_ports(pid: int) -> set[int]:
    """The local ports of process ``pid``'s TCP sockets (its own socket inodes in /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:  # closed while listed (the burst's client connections are still closing)
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[9] in inodes:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def sessions_of(pool: SyncPool, pid: int) -> set[int]:
    """Backend pids of the PostgreSQL sessions process ``pid`` holds open from its request pool."""
    ports = local_ports(pid)
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT pid, client_port FROM pg_stat_activity WHERE application_name = 'fatura-http'"
        ).fetchall()
    return {int(r["pid"]) for r in rows if r["client_port"] in ports}


def test_a_burst_larger_than_the_pool_is_answered_on_its_few_connections(
    small_pool_edge: ServiceProcess, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant()
    keys = [f"pool-{uuid.uuid4()}" for _ in range(BURST)]
    with httpx.Client(
        base_url=small_pool_edge.base_url or "", timeout=30, limits=httpx.Limits(max_connections=BURST)
    ) as client:

        def post(key: str) -> httpx.Response:
            return client.post(
                "/v1/extraction-jobs", json=job_body(), headers={**tenant.headers, "Idempotency-Key": key}
            )

        with ThreadPoolExecutor(max_workers=BURST) as threads:
            replies = list(threads.map(post, keys))

    assert [r.status_code for r in replies] == [202] * BURST, [
        r.text for r in replies if r.status_code != 202
    ]
    job_ids = {r.json()["job_id"] for r in replies}
    assert len(job_ids) == BURST
    with pool.connection() as conn:
        stored = conn.execute(
            "SELECT idempotency_key FROM extraction_jobs WHERE tenant_id = %s", (tenant.id,)
        ).fetchall()
    assert sorted(r["idempotency_key"] for r in stored) == sorted(keys)
    assert 1 <= len(sessions_of(pool, small_pool_edge.process.pid)) <= 2
