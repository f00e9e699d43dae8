"""The edge's grouped accept writes (services/acceptance/group_write.py) through a PostgreSQL cut: 40
clients submit at once while the edge's path to PostgreSQL is cut for 2 s. A request is answered
202 or 503, never 500; the clients retry the 503s with the same Idempotency-Key; in the end every
key has exactly one job, with one outbox event, and every 202 for a key named that job."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from fix_api import job_body
from fix_db import MakeTenant, SyncPool, tenant_jobs
from fix_pipeline import wait_until
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.chaos.proxy import FaultProxy

pytestmark = pytest.mark.chaos

CLIENTS = 40
CUT_SECONDS = 2.0


@pytest.fixture
def proxy(database_url: str) -> Iterator[FaultProxy]:
    real = conninfo_to_dict(database_url)
    p = FaultProxy("postgresql", str(real.get("host") or "127.0.0.1"), int(real.get("port") or 5432))
    p.start()
    yield p
    p.close()


@pytest.fixture
def edge(spawn: SpawnFn, database_url: str, proxy: FaultProxy) -> Iterator[ServiceProcess]:
    url = make_conninfo(database_url, host="127.0.0.1", port=str(proxy.port))
    process = start_edge(spawn, workers=1, FATURA_DATABASE_URL=url, FATURA_ACCEPT_WRITERS="1")
    yield process
    process.stop()


def test_a_cut_under_concurrent_submissions_answers_503_and_the_retries_make_each_job_once(
    edge: ServiceProcess, proxy: FaultProxy, make_tenant: MakeTenant, pool: SyncPool
) -> None:
    tenant = make_tenant()
    statuses: Counter[int] = Counter()
    answered: dict[str, set[str]] = {}  # key -> the job ids its 202s named
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(base_url=edge.base_url or "", timeout=30) as http:
            while not stop.is_set():
                key = f"cut-{n}-{uuid.uuid4()}"
                while True:  # the same key until it is accepted, as a client retrying a 503 does
                    try:
                        reply = http.post(
                            "/v1/extraction-jobs",
                            json=job_body(),
                            headers={**tenant.headers, "Idempotency-Key": key},
                        )
                    except httpx.TransportError:
                        time.sleep(0.05)
                        continue
                    with lock:
                        statuses[reply.status_code] += 1
                        if reply.status_code == 202:
                            answered.setdefault(key, set()).add(reply.json()["job_id"])
                    if reply.status_code == 202:
                        break
                    assert reply.status_code == 503, reply.text
                    time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(CLIENTS)]
    for t in threads:
        t.start()
    try:
        # Given submissions under way on every client
        wait_until(lambda: statuses[202] >= 200, 60, "200 jobs accepted")
        # When the edge's path to PostgreSQL is cut
        proxy.cut(CUT_SECONDS)
        wait_until(lambda: not proxy.cutting, 60, "the cut over")
        # (and the clients go on until the edge has taken 200 more after it)
        after = statuses[202]
        wait_until(lambda: statuses[202] >= after + 200, 60, "200 more jobs accepted")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a client never got its job accepted"

    # Then the cut was felt (503s), and no request got another error
    assert statuses[503] > 0, statuses
    assert set(statuses) == {202, 503}, statuses
    # And every key has exactly one job, with one outbox event, the one its 202s named
    rows = tenant_jobs(pool, tenant.id)
    stored = {r["idempotency_key"]: r for r in rows}
    assert len(stored) == len(rows)  # one job per key
    assert sorted(stored) == sorted(answered)
    assert all(answered[k] == {str(stored[k]["id"])} for k in stored)
    assert all(r["outbox"] == 1 for r in rows)
