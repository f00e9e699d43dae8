"""Ceilings: what the raw means reach on the same machine in the same run, beside each bench's figure.

``in_child`` runs a ceiling in a fresh process, so it shares neither the GIL nor a CPU account with
the bench. The edge's accept statement alone is ``fatura bench accept``'s ceiling (``sql_ceiling``);
``accept_one``, one job exactly as the edge writes it far from any limit, is also how the inference
benches write their backlogs, faster than HTTP; the pipeline bench writes its burst with
``accept_many``, in groups, as the edge's writers commit a burst.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row

from bench import cpu
from bench.load import Calls, closed_loop
from bench.report import percentile
from services.acceptance.accept import plan_job, write_params
from services.acceptance.queries import Q as ACCEPT_Q
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.common.ids import new_id
from services.sandbox.samples import load_samples

T = TypeVar("T")
ACCEPT = AcceptanceSettings()


@dataclass(frozen=True)
class SqlCeiling:
    connections: int
    tx_per_second: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_job: dict[str, float]  # client (the psycopg process), postgres, other
    group: int = 1  # jobs per transaction


def in_child(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh process (spawned: the bench's threads and locks stay behind)."""
    with mp.get_context("spawn").Pool(1) as pool:
        result: T = pool.apply(fn, args)
    return result


def accept_params(tenant_id: uuid.UUID, text: str, priority: str = "batch") -> dict[str, Any]:
    """``accept_job``'s parameters for one new job, as the edge makes them far from any limit."""
    key = f"bench-{uuid.uuid4()}"
    data = text.encode()
    digest = hashlib.sha256(data).hexdigest()
    request = CreateJob(
        document=DocumentBody(text, "invoice.txt", len(data), digest),
        schema="invoice.v1",
        priority=priority,
        deadline_seconds=ACCEPT.default_deadline_seconds,
        options={},
    )
    plan = plan_job(ACCEPT, tenant_id, key, request, len(data), digest)
    return write_params(ACCEPT, tenant_id, key, request, plan, new_id())


def accept_one(
    conn: psycopg.Connection[Any], tenant_id: uuid.UUID, text: str, priority: str = "batch"
) -> uuid.UUID:
    """One job as the edge accepts it far from any limit: the single ``accept_job`` statement.

    The edge's HTTP and JSON work is left out; near a limit the edge also reads the admission snapshot
    first, which is not the steady state.
    """
    params = accept_params(tenant_id, text, priority)
    row = conn.execute(ACCEPT_Q["accept_job"], params)
    if row.fetchone() is None:
        raise SystemExit("the accept statement wrote nothing")
    job_id: uuid.UUID = params["job_id"]
    return job_id


def accept_group(conn: psycopg.Connection[Any], tenant_id: uuid.UUID, text: str, size: int) -> None:
    """``size`` jobs as the edge's writers commit them under load (services/acceptance/group_write.py):
    ``accept_job`` once per job, pipelined, in one transaction."""
    accept_many(conn, tenant_id, [text] * size)


def accept_many(
    conn: psycopg.Connection[Any], tenant_id: uuid.UUID, texts: list[str], priority: str = "batch"
) -> list[uuid.UUID]:
    """One job per text in one transaction, ``accept_job`` once per job, pipelined: a group as the
    edge's writers commit it under load (services/acceptance/group_write.py). The new jobs' ids."""
    params = [accept_params(tenant_id, text, priority) for text in texts]
    cursor = conn.cursor()
    with conn.transaction():
        cursor.executemany(ACCEPT_Q["accept_job"], params, returning=True)
        written = int(cursor.fetchone() is not None)
        while cursor.nextset():
            written += cursor.fetchone() is not None
    if written != len(params):
        raise SystemExit("the accept statements wrote fewer jobs than they were given")
    return [p["job_id"] for p in params]


def accept_sql(
    database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float, group: int = 1
) -> tuple[Calls, dict[str, float]]:
    """Closed loop: each connection runs ``accept_one`` (or, with ``group`` > 1, ``accept_group``)
    back to back for ``seconds``; the calls and the CPU seconds of this process (``client``),
    PostgreSQL and the rest of the machine meanwhile."""
    text = load_samples()[0].text
    database = str(conninfo_to_dict(database_url).get("dbname"))
    split: dict[str, float] = {}

    @contextmanager
    def measured() -> Iterator[None]:
        before = cpu.sample()
        yield
        split.update(cpu.split(before, cpu.sample(), {"client": {os.getpid()}}, database))

    def connect() -> psycopg.Connection[dict[str, Any]]:
        return psycopg.connect(
            database_url, row_factory=dict_row, application_name="fatura-bench", autocommit=True
        )

    def one(conn: psycopg.Connection[dict[str, Any]]) -> None:
        if group == 1:
            accept_one(conn, tenant_id, text)
        else:
            accept_group(conn, tenant_id, text, group)

    return closed_loop(connections, connect, one, seconds=seconds, window=measured), split


def sql_ceiling(
    database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float, group: int = 1
) -> SqlCeiling:
    """``accept_sql`` in a process of its own: jobs/s, latency (per statement, or per group of
    ``group`` jobs) and CPU per job."""
    calls, split = in_child(accept_sql, database_url, tenant_id, connections, seconds, group)
    latencies, jobs = calls.latencies(), max(1, group * len(calls.starts))
    return SqlCeiling(
        connections,
        jobs / calls.seconds,
        1000 * percentile(latencies, 0.50),
        1000 * percentile(latencies, 0.99),
        {k: 1000 * v / jobs for k, v in split.items()},
        group,
    )
