"""The extraction pipeline as real processes on a database and queue prefix of its own: HTTP edge,
relay, limiter, simulated provider, inference workers and scheduler, with timers shortened so
leases, retries and deadlines play out in seconds."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.resources import delete_keys
from fix_amqp import delete_queues
from fix_db import TenantHandle, drop_database, recreate_database
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.acceptance.tenants import TenantSpec, create_tenant, import_suppliers, parse_suppliers
from services.common.db import SyncPool, sync_pool
from services.common.migrate import migrate
from services.common.procs import free_port, stop_all
from services.common.settings import CommonSettings
from services.sandbox.samples import SUPPLIERS_CSV

LIMITER_CONFIG = """
[pools.sandbox]
rpm = 100000
tpm = 1000000000
max_in_flight = 64

[tenant_defaults]
max_in_flight = 64
"""

# Timers short enough that a lease expires, a retry comes due or a deadline passes within seconds.
FAST_TIMERS = {
    "FATURA_LEASE_SECONDS": "2",
    "FATURA_HEARTBEAT_SECONDS": "0.5",
    "FATURA_SCHEDULER_INTERVAL_SECONDS": "0.2",
    "FATURA_RETRY_BASE_SECONDS": "0.2",
    "FATURA_RETRY_CAP_SECONDS": "1",
    "FATURA_ATTEMPT_DEADLINE_SECONDS": "10",
    "FATURA_DEADLINE_MARGIN_SECONDS": "0",
    "FATURA_SLOT_WAIT_SECONDS": "2",
    "FATURA_INFERENCE_CONCURRENCY": "4",
    "FATURA_PROVIDER_BREAKER_COOLDOWN_SECONDS": "1",
    "FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS": "20",
    "FATURA_RELAY_CLAIM_TIMEOUT_SECONDS": "2",
}

TERMINAL = {"SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL", "CANCELLED"}


@dataclass
class Pipeline:
    spawn: SpawnFn
    env: dict[str, str]
    pool: SyncPool
    edge: ServiceProcess
    provider_url: str
    relay: ServiceProcess
    others: list[ServiceProcess] = field(default_factory=list)
    workers: list[ServiceProcess] = field(default_factory=list)
    schedulers: list[ServiceProcess] = field(default_factory=list)

    def stop(self) -> None:
        """End this pipeline's processes before its database goes away: its workers, schedulers,
        relay and edge together, then ``others`` (the limiter and provider the first wave may still
        call while it drains, and what a module added there, such as the delivery pair). Each wave
        takes its slowest process's time."""
        stop_all([*self.workers, *self.schedulers, self.relay, self.edge])
        stop_all(self.others)

    def start_worker(self, *, wait: bool = True, **env: str) -> ServiceProcess:
        """An inference worker; ``wait=False`` returns at once (``wait_ready()`` later)."""
        port = free_port()
        worker = self.spawn(
            "inference-worker",
            **{**self.env, "FATURA_INFERENCE_METRICS_PORT": str(port), "FATURA_WORKER_ID": f"w{port}", **env},
        )
        worker.base_url = f"http://127.0.0.1:{port}"
        worker.ready_url = f"{worker.base_url}/readyz"
        if wait:
            worker.wait_ready()
        self.workers.append(worker)
        return worker

    def start_scheduler(self, *, wait: bool = True, **env: str) -> ServiceProcess:
        """An inference scheduler; ``wait=False`` returns at once (``wait_ready()`` later)."""
        port = free_port()
        scheduler = self.spawn(
            "inference-scheduler", **{**self.env, "FATURA_SCHEDULER_METRICS_PORT": str(port), **env}
        )
        scheduler.ready_url = f"http://127.0.0.1:{port}/readyz"
        if wait:
            scheduler.wait_ready()
        self.schedulers.append(scheduler)
        return scheduler

    def start_processing(self, *, delivery: bool = False) -> None:
        """The inference scheduler and a worker and, with ``delivery``, the delivery worker and
        scheduler (in ``others``): started together, then each waited for."""
        started = [self.start_scheduler(wait=False), self.start_worker(wait=False)]
        if delivery:
            for name, port_variable in (
                ("delivery-worker", "FATURA_DELIVERY_WORKER_METRICS_PORT"),
                ("delivery-scheduler", "FATURA_DELIVERY_SCHEDULER_METRICS_PORT"),
            ):
                port = free_port()
                process = self.spawn(name, **{**self.env, port_variable: str(port)})
                process.ready_url = f"http://127.0.0.1:{port}/readyz"
                self.others.append(process)
                started.append(process)
        for process in started:
            process.wait_ready()

    def restart_relay(self, **env: str) -> ServiceProcess:
        """Replace the relay by one with extra settings (for example a fault point)."""
        if self.relay.alive():
            self.relay.stop()
        self.relay = self.spawn("relay", **{**self.env, "FATURA_RELAY_METRICS_PORT": str(free_port()), **env})
        return self.relay

    def make_tenant(self, **limits: Any) -> TenantHandle:
        tenant_id, key = create_tenant(self.pool, TenantSpec(name=f"t-{uuid.uuid4().hex[:8]}", **limits))
        import_suppliers(self.pool, tenant_id, parse_suppliers(SUPPLIERS_CSV))
        return TenantHandle(tenant_id, key)

    def client(self) -> httpx.Client:
        assert self.edge.base_url is not None
        return httpx.Client(base_url=self.edge.base_url, timeout=30.0)

    def submit(self, tenant: TenantHandle, text: str, **extra: Any) -> str:
        with self.client() as c:
            response = c.post(
                "/v1/extraction-jobs",
                json={"document": {"text": text, "filename": "invoice.txt"}, **extra},
                headers={**tenant.headers, "Idempotency-Key": f"k-{uuid.uuid4()}"},
            )
        assert response.status_code == 202, response.text
        return str(response.json()["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        with self.pool.connection() as conn:
            row = conn.execute("SELECT * FROM extraction_jobs WHERE id = %s", (job_id,)).fetchone()
        assert row is not None
        return row

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        with self.pool.connection() as conn:
            return conn.execute(
                "SELECT * FROM job_attempts WHERE job_id = %s ORDER BY id", (job_id,)
            ).fetchall()

    def wait_state(self, job_id: str, states: set[str], timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if job["state"] in states:
                return job
            time.sleep(0.1)
        raise AssertionError(
            f"job {job_id} is {self.job(job_id)['state']}, not in {states}, after {timeout}s"
        )

    def published(self, job_id: str) -> bool:
        """Whether the relay has published every outbox event of the job."""
        with self.pool.connection() as conn:
            row = conn.execute(
                "SELECT bool_and(published_at IS NOT NULL) AS done FROM outbox_events WHERE job_id = %s",
                (job_id,),
            ).fetchone()
        return bool(row and row["done"])

    def reset(self) -> None:
        """Between two tests of a module: no provider fault, no worker left running."""
        self.clear_faults()
        stop_all(self.workers)
        self.workers.clear()

    def provider(self, method: str, path: str, **kwargs: Any) -> Any:
        response = httpx.request(method, f"{self.provider_url}{path}", timeout=10.0, **kwargs)
        response.raise_for_status()
        return response.json() if response.content else None

    def fault(self, mode: str, **params: Any) -> None:
        self.provider("POST", "/admin/faults", json={"mode": mode, **params})

    def clear_faults(self) -> None:
        self.provider("DELETE", "/admin/faults")

    def provider_requests(self) -> int:
        stats = self.provider("GET", "/admin/stats")
        return int(stats["requests_total"])


StartPipeline = Callable[..., Pipeline]


def wait_until(condition: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"{what} not met within {timeout}s")


@pytest.fixture(scope="module")
def pipeline_factory(
    spawn: SpawnFn, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[StartPipeline]:
    """Start a pipeline (no workers yet) on a fresh database of this module's own."""
    made: list[tuple[str, SyncPool, Pipeline]] = []

    def start(limiter_config: str = LIMITER_CONFIG, **env: str) -> Pipeline:
        url = f"{database_url}_p{len(made)}"
        recreate_database(url)
        migrate(url)
        prefix = f"pipe-{uuid.uuid4().hex[:8]}"
        config = tmp_path_factory.mktemp("limiter") / "limiter.toml"
        config.write_text(limiter_config)
        limiter_port, provider_port = free_port(), free_port()
        base = {
            "FATURA_DATABASE_URL": url,
            "FATURA_QUEUE_PREFIX": prefix,
            "FATURA_LIMITER_ADDRESS": f"127.0.0.1:{limiter_port}",
            "FATURA_PROVIDER_BASE_URL": f"http://127.0.0.1:{provider_port}/v1",
            "FATURA_PROVIDER_BREAKER_PREFIX": f"fatura:test:{prefix}:breaker",
            **FAST_TIMERS,
            **env,
        }
        pool = sync_pool(CommonSettings(database_url=url), name="pipeline-tests", max_size=4)
        pool.open()
        limiter_metrics = free_port()
        limiter = spawn(
            "limiter",
            **base,
            FATURA_LIMITER_PORT=str(limiter_port),
            FATURA_LIMITER_METRICS_PORT=str(limiter_metrics),
            FATURA_LIMITER_CONFIG=str(config),
            FATURA_LIMITER_KEY_PREFIX=f"fatura:test:{prefix}",
        )
        limiter.ready_url = f"http://127.0.0.1:{limiter_metrics}/readyz"
        provider = spawn("provider", **base, FATURA_SANDBOX_PROVIDER_PORT=str(provider_port))
        provider_url = f"http://127.0.0.1:{provider_port}"
        provider.ready_url = f"{provider_url}/readyz"
        relay = spawn("relay", **base, FATURA_RELAY_METRICS_PORT=str(free_port()))
        edge = start_edge(spawn, workers=1, wait=False, FATURA_AUTH_CACHE_SECONDS="0", **base)
        # Started together, each importing its modules at once; then each is waited for.
        for process in (limiter, provider, edge):
            process.wait_ready()
        pipeline = Pipeline(spawn, base, pool, edge, provider_url, relay, others=[limiter, provider])
        made.append((url, pool, pipeline))
        return pipeline

    yield start
    for url, pool, pipeline in made:
        pipeline.stop()
        pool.close()
        drop_database(url)
        delete_queues(pipeline.env["FATURA_QUEUE_PREFIX"])
        # The limiter's permits and budgets and the provider breaker's state of this pipeline.
        delete_keys(CommonSettings.from_env().redis_url, f"fatura:test:{pipeline.env['FATURA_QUEUE_PREFIX']}")


def sample_text(name: str) -> str:
    return (Path(SUPPLIERS_CSV).parent / name).read_text(encoding="utf-8")
