"""The stack as real processes for the benchmarks: the edge (and the relay) for ``fatura bench accept``,
the ERP and the delivery processes for ``delivery``, the inference pipeline for ``pipeline``,
``quota`` and ``fairness``.

Everything is private to one run: a database of its own whose name contains ``bench`` (dropped and
recreated), a queue prefix, limiter port and Redis key prefix, provider port and metrics ports, so
a developer's ``fatura up`` and the test suite are never touched. Processes are ``fatura run NAME``
children in their own process groups, stopped by pid when the run ends; their queues and Redis keys
are deleted then. Jobs are written with the acceptance edge's own ``accept_job`` statement, which
is faster than HTTP and writes exactly what the edge writes (job, inline document, job event, outbox
event); ``submit_http`` goes through the edge when the HTTP path itself matters.
"""

from __future__ import annotations

import argparse
import os
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from psycopg.rows import dict_row

from bench import cpu
from bench.ceiling import accept_many, accept_one
from bench.procs import Proc, start
from bench.report import OUT_DIR
from bench.resources import add_database_argument, bench_database, delete_keys, delete_queues
from services.acceptance.tenants import Supplier, TenantSpec, create_tenant, import_suppliers, parse_suppliers
from services.common import events
from services.common.db import SyncPool, sync_pool
from services.common.procs import free_port
from services.common.queries import load_queries
from services.common.settings import CommonSettings
from services.sandbox.samples import SUPPLIERS_CSV, Sample, load_samples

JOBS_PATH = "/v1/extraction-jobs"
Q = load_queries(Path(__file__).with_name("sql") / "bench.sql")
TERMINAL = frozenset({"SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL", "CANCELLED"})
# Prometheus family (as the parser names it) -> short name in the benchmarks' output.
WORKER_COUNTERS = {
    "fatura_inference_deferrals": "deferred",
    "fatura_limiter_client_unreachable": "limiter_past_deadline",
    "fatura_inference_claims": "claims",
    "fatura_provider_hops": "hops",
    "fatura_inference_stale_completions": "stale_completions",
    "fatura_inference_ingest_wakeups": "wakeups",
    "fatura_inference_relay_nudges": "relay_nudges",
    # A histogram: its _count is the group commit's transactions, its _sum the writes in them.
    "fatura_group_commit_writes": "group_commit",
}


def add_stack_arguments(p: argparse.ArgumentParser, database: str) -> None:
    add_database_argument(p, database)
    p.add_argument(
        "--limiter-deadline-ms",
        type=int,
        default=0,
        help="FATURA_LIMITER_DEADLINE_MS of the workers (default: the service's own, 250 ms)",
    )


def limiter_toml(
    *,
    rpm: int,
    tpm: int,
    max_in_flight: int,
    tenant_max_in_flight: int,
    window_ms: int = 60_000,
    pacing: str | None = None,
    burst_seconds: float | None = None,
) -> str:
    """One pool, ``sandbox``: the pool the worker's provider asks permits of by default. ``pacing``
    and ``burst_seconds`` None: the pool's defaults."""
    paced = f'pacing = "{pacing}"\n' if pacing else ""
    paced += f"burst_seconds = {burst_seconds}\n" if burst_seconds is not None else ""
    return (
        f"[pools.sandbox]\nrpm = {rpm}\ntpm = {tpm}\nmax_in_flight = {max_in_flight}\n"
        f"window_ms = {window_ms}\n{paced}\n"
        f"[tenant_defaults]\nmax_in_flight = {tenant_max_in_flight}\n"
    )


class Stack:
    """One benchmark's processes, database, queues and limiter keys; a context manager that says where
    they are when entered and removes them when left (the process logs stay)."""

    def __init__(self, label: str, database: str, *, limiter_deadline_ms: int = 0) -> None:
        self.label = label
        self.database = database
        self.database_url = bench_database(database)
        self.prefix = f"bench-{label}-{uuid.uuid4().hex[:8]}"
        self.key_prefix = f"fatura:bench:{self.prefix}"
        self.log_dir = OUT_DIR / f"bench-{label}-logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.limiter_port, self.provider_port = free_port(), free_port()
        self.provider_url = f"http://127.0.0.1:{self.provider_port}"
        self.edge_url: str | None = None
        self.env = {
            "FATURA_DATABASE_URL": self.database_url,
            "FATURA_QUEUE_PREFIX": self.prefix,
            "FATURA_LIMITER_ADDRESS": f"127.0.0.1:{self.limiter_port}",
            "FATURA_PROVIDER_BASE_URL": f"{self.provider_url}/v1",
            "FATURA_PROVIDER_BREAKER_PREFIX": f"{self.key_prefix}:breaker",
            "FATURA_LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        if limiter_deadline_ms:
            self.env["FATURA_LIMITER_DEADLINE_MS"] = str(limiter_deadline_ms)
        self.common = CommonSettings.from_env({**os.environ, **self.env})
        self.procs: list[Proc] = []
        self._started = 0
        self.pool: SyncPool = sync_pool(self.common, name=f"bench-{label}", max_size=8)
        self.pool.open()

    def __enter__(self) -> Stack:
        print(
            f"database {self.database}, queue prefix {self.prefix}; process logs in {self.log_dir}",
            flush=True,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ processes

    def start(self, name: str, ready_url: str, **env: str) -> Proc:
        """Start ``fatura run NAME`` with ``env`` over the stack's own (``wait_ready`` before use)."""
        self._started += 1  # not len(self.procs): stopped processes leave it, their logs stay
        log_path = self.log_dir / f"{name}-{self._started}.log"
        proc = start(name, ("run", name), log_path, {**self.env, **env}, ready_url)
        self.procs.append(proc)
        return proc

    def spawn(self, name: str, ready_url: str, **env: str) -> Proc:
        """``start``, and wait until it is ready."""
        return self.start(name, ready_url, **env).wait_ready()

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    def start_metered(self, name: str, metrics_variable: str, **env: str) -> Proc:
        """``start`` with a free port in ``metrics_variable``: the process's metrics and its /readyz."""
        metrics = free_port()
        return self.start(
            name, f"http://127.0.0.1:{metrics}/readyz", **env, **{metrics_variable: str(metrics)}
        )

    def start_limiter(self, config: str) -> Proc:
        path = self.log_dir / "limiter.toml"
        path.write_text(config, encoding="utf-8")
        return self.start_metered(
            "limiter",
            "FATURA_LIMITER_METRICS_PORT",
            FATURA_LIMITER_PORT=str(self.limiter_port),
            FATURA_LIMITER_CONFIG=str(path.resolve()),
            FATURA_LIMITER_KEY_PREFIX=self.key_prefix,
        ).wait_ready()

    def start_provider(
        self,
        *,
        rpm: int = 0,
        tpm: int = 0,
        concurrency: int = 0,
        latency_ms: float = 0.0,
        distribution: str = "fixed",
        per_second: bool = False,
    ) -> Proc:
        return self.spawn(
            "provider",
            f"{self.provider_url}/readyz",
            FATURA_SANDBOX_PROVIDER_PORT=str(self.provider_port),
            FATURA_SANDBOX_PROVIDER_RPM=str(rpm),
            FATURA_SANDBOX_PROVIDER_TPM=str(tpm),
            FATURA_SANDBOX_PROVIDER_CONCURRENCY=str(concurrency),
            FATURA_SANDBOX_PROVIDER_LATENCY_MS=str(latency_ms),
            FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION=distribution,
            FATURA_SANDBOX_PROVIDER_API_KEY="",
            FATURA_SANDBOX_PROVIDER_PER_SECOND="1" if per_second else "0",
        )

    def start_relay(self) -> Proc:
        return self.start_metered("relay", "FATURA_RELAY_METRICS_PORT").wait_ready()

    def start_scheduler(self, **env: str) -> Proc:
        return self.start_metered("inference-scheduler", "FATURA_SCHEDULER_METRICS_PORT", **env).wait_ready()

    def start_worker(self, **env: str) -> Proc:
        worker_id = f"bench-{uuid.uuid4().hex[:8]}"
        return self.start_metered(
            "inference-worker", "FATURA_INFERENCE_METRICS_PORT", FATURA_WORKER_ID=worker_id, **env
        ).wait_ready()

    def start_edge(self, workers: int = 1, **env: str) -> Proc:
        port, metrics = free_port(), free_port()
        self.edge_url = f"http://127.0.0.1:{port}"
        return self.spawn(
            "http",
            f"{self.edge_url}/readyz",
            FATURA_HTTP_HOST="127.0.0.1",
            FATURA_HTTP_PORT=str(port),
            FATURA_HTTP_METRICS_PORT=str(metrics),
            FATURA_HTTP_WORKERS=str(workers),
            FATURA_MAX_SYSTEM_BACKLOG=str(10**9),
            **env,
        )

    def stop_all(self) -> None:
        """Stop every process, the last started first."""
        for proc in reversed(self.procs):
            proc.stop()
        self.procs.clear()

    def close(self) -> None:
        self.stop_all()
        self.pool.close()
        delete_queues(self.common.amqp_url, [*events.all_queues(self.prefix), noop_queue(self.prefix)])
        delete_keys(self.common.redis_url, self.key_prefix)

    def cpu_seconds(self, before: cpu.CpuSample, after: cpu.CpuSample) -> dict[str, float]:
        """CPU seconds between the samples by the stack's process name (each with its children),
        ``bench`` (this process: the accepting threads), ``rabbitmq``, ``redis``, ``postgres``, ``other``."""
        groups: dict[str, set[int]] = {}
        for proc in self.procs:
            groups.setdefault(proc.name, set()).update(cpu.tree(after, {proc.pid}))
        groups["bench"] = {os.getpid()}
        return cpu.split(before, after, groups, self.database, servers=True)

    # ------------------------------------------------------------ tenants and jobs

    def make_tenant(
        self, name: str, *, max_in_flight: int, weight: int = 1, extra_suppliers: int = 0
    ) -> tuple[uuid.UUID, str]:
        """A tenant no admission limit stops, with the sample suppliers as its master data and
        ``extra_suppliers`` more (none of them on the sample invoices)."""
        spec = TenantSpec(
            name=f"{name}-{uuid.uuid4().hex[:6]}",
            weight=weight,
            max_in_flight=max_in_flight,
            max_pending_jobs=10**9,
            max_pending_bytes=10**15,
            max_pending_tokens=10**15,
            daily_token_budget=10**15,
        )
        tenant_id, key = create_tenant(self.pool, spec)
        extra = [Supplier(f"BENCH{n:08d}", f"Bench supplier {n}", None, None) for n in range(extra_suppliers)]
        import_suppliers(self.pool, tenant_id, parse_suppliers(SUPPLIERS_CSV) + extra)
        return tenant_id, key

    def accept_jobs(
        self,
        tenant_id: uuid.UUID,
        count: int,
        *,
        priority: str = "batch",
        connections: int = 4,
        group: int = 1,
        on_accepted: Callable[[int], None] | None = None,
    ) -> list[uuid.UUID]:
        """Accept ``count`` jobs with sample invoices that validate (they end SUCCEEDED): one
        transaction per job, or with ``group`` > 1 up to that many per transaction, as the edge's
        writers commit a burst. ``on_accepted`` is told how many jobs each commit made."""
        told = on_accepted or (lambda _: None)
        texts = [s.text for s in load_samples() if s.expect == "SUCCEEDED"]
        chunks = [range(i, count, connections) for i in range(connections)]

        def write(indices: range) -> list[uuid.UUID]:
            made = []
            with psycopg.connect(self.database_url, row_factory=dict_row, autocommit=True) as conn:
                if group > 1:
                    for start in range(0, len(indices), group):
                        part = [texts[i % len(texts)] for i in indices[start : start + group]]
                        made.extend(accept_many(conn, tenant_id, part, priority))
                        told(len(part))
                    return made
                for i in indices:
                    made.append(accept_one(conn, tenant_id, texts[i % len(texts)], priority))
                    told(1)
            return made

        with ThreadPoolExecutor(connections) as threads:
            return [job for chunk in threads.map(write, chunks) for job in chunk]

    def submit_http(self, api_key: str, *, priority: str = "interactive") -> uuid.UUID:
        """One job through ``POST /v1/extraction-jobs`` of the edge (``start_edge`` first)."""
        assert self.edge_url is not None
        sample = next(s for s in load_samples() if s.expect == "SUCCEEDED")
        response = httpx.post(
            f"{self.edge_url}{JOBS_PATH}",
            json=job_body(sample, priority),
            headers={"Authorization": f"Bearer {api_key}", "Idempotency-Key": f"bench-{uuid.uuid4()}"},
            timeout=30.0,
        )
        if response.status_code != 202:
            raise SystemExit(f"the edge answered {response.status_code}: {response.text}")
        return uuid.UUID(response.json()["job_id"])

    def query(self, name: str, **params: Any) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            return conn.execute(Q[name], params).fetchall()

    def tenant_states(self, tenant_id: uuid.UUID) -> Counter[str]:
        return Counter({row["state"]: row["n"] for row in self.query("tenant_states", tenant_id=tenant_id)})

    def tenant_pending(self, tenant_id: uuid.UUID) -> int:
        """The tenant's jobs not yet terminal, from the admission counters (a cheap read)."""
        return int(self.query("tenant_pending", tenant_id=tenant_id)[0]["n"])

    def worker_counters(self) -> dict[str, float]:
        """What the running inference workers counted, summed over them: deferrals by reason, limiter
        calls past their deadline by method, claim results, hops by outcome, stale completions,
        wake-ups, relay nudges, and the inbox group commit's transactions and writes."""
        totals: dict[str, float] = {}
        for proc in self.procs:
            if proc.name != "inference-worker":
                continue
            text = httpx.get(proc.ready_url.removesuffix("/readyz") + "/metrics", timeout=5.0).text
            for family in text_string_to_metric_families(text):
                if family.name not in WORKER_COUNTERS:
                    continue
                for sample in family.samples:
                    if sample.name.endswith("_total"):
                        part = ""
                    elif family.type == "histogram" and sample.name.endswith(("_count", "_sum")):
                        part = ":transactions" if sample.name.endswith("_count") else ":writes"
                    else:
                        continue
                    labels = ",".join(v for k, v in sorted(sample.labels.items()) if k != "channel")
                    key = f"{WORKER_COUNTERS[family.name]}{':' + labels if labels else ''}{part}"
                    totals[key] = totals.get(key, 0.0) + sample.value
        return {k: v for k, v in sorted(totals.items()) if v}

    def provider_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = httpx.get(f"{self.provider_url}/admin/stats", timeout=5.0).json()
        return stats

    def reset_provider_stats(self) -> None:
        httpx.delete(f"{self.provider_url}/admin/stats", timeout=5.0).raise_for_status()


def job_body(sample: Sample, priority: str) -> dict[str, Any]:
    """The body of ``POST /v1/extraction-jobs`` for one sample invoice, inline."""
    return {"document": {"text": sample.text, "filename": sample.filename}, "priority": priority}


def noop_queue(prefix: str) -> str:
    return f"{prefix}.bench.noop"
