"""Ceilings: what the raw means reach on the same machine in the same run, beside each bench's figure.

``in_child`` runs a ceiling in a fresh process, so it shares neither the GIL nor a CPU account with
the bench. The edge's accept statement alone is ``fatura bench accept``'s ceiling (``sql_ceiling``);
``accept_one``, one job exactly as the edge writes it far from any limit, is also how the inference
benches write their backlogs, faster than HTTP.
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


def in_child(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a fresh process (spawned: the bench's threads and locks stay behind)."""
    with mp.get_context("spawn").Pool(1) as pool:
        result: T = pool.apply(fn, args)
    return result


def accept_one(
    conn: psycopg.Connection[Any], tenant_id: uuid.UUID, text: str, priority: str = "batch"
) -> uuid.UUID:
    """One job as the edge accepts it far from any limit: the single ``accept_job`` statement.

    The edge's HTTP and JSON work is left out; near a limit the edge also reads the admission snapshot
    first, which is not the steady state.
    """
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
    job_id = new_id()
    row = conn.execute(ACCEPT_Q["accept_job"], write_params(ACCEPT, tenant_id, key, request, plan, job_id))
    if row.fetchone() is None:
        raise SystemExit("the accept statement wrote nothing")
    return job_id


def accept_sql(
    database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float
) -> tuple[Calls, dict[str, float]]:
    """Closed loop: each connection runs ``accept_one`` back to back for ``seconds``; the calls and the
    CPU seconds of this process (``client``), PostgreSQL and the rest of the machine meanwhile."""
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
        accept_one(conn, tenant_id, text)

    return closed_loop(connections, connect, one, seconds=seconds, window=measured), split


def sql_ceiling(database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float) -> SqlCeiling:
    """``accept_sql`` in a process of its own: jobs/s, latency and CPU per job."""
    calls, split = in_child(accept_sql, database_url, tenant_id, connections, seconds)
    latencies, jobs = calls.latencies(), max(1, len(calls.starts))
    return SqlCeiling(
        connections,
        len(calls.starts) / calls.seconds,
        1000 * percentile(latencies, 0.50),
        1000 * percentile(latencies, 0.99),
        {k: 1000 * v / jobs for k, v in split.items()},
    )
