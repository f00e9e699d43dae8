"""Fixtures that run the stack's processes for real (``fatura run NAME``) and end them by pid."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from services.common.procs import ChildProcess, fatura_command, free_port, stop_all

ROOT = Path(__file__).resolve().parents[1]


@dataclass(eq=False)
class ServiceProcess(ChildProcess):
    """A ``fatura run NAME`` child, with the environment it was given over the test's own."""

    env: dict[str, str] = field(default_factory=dict)
    base_url: str | None = None

    def overdue(self) -> None:
        """Write the child's threads' stacks to its log (``py-spy dump``) before it is killed, so a
        test that finds it killed shows where it hung."""
        if self.log_path is None:
            return
        spy = Path(sys.executable).parent / "py-spy"
        try:
            dumped = subprocess.run(
                [str(spy), "dump", "--pid", str(self.process.pid)], capture_output=True, text=True, timeout=20
            )
            text = dumped.stdout + dumped.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            text = f"py-spy dump failed: {exc}\n"
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"\n--- {self.name} did not stop in time; its stacks (py-spy dump):\n{text}")


@pytest.fixture(scope="session")
def base_env(database_url: str, queue_prefix: str) -> dict[str, str]:
    return {
        "FATURA_DATABASE_URL": database_url,
        "FATURA_QUEUE_PREFIX": queue_prefix,
        "FATURA_LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


SpawnFn = Callable[..., ServiceProcess]


@pytest.fixture(scope="session")
def spawn(base_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[SpawnFn]:
    """Start ``fatura run NAME`` with extra environment; every process is ended at session end."""
    started: list[ServiceProcess] = []
    log_dir = tmp_path_factory.mktemp("process-logs")

    def start(name: str, **env: str) -> ServiceProcess:
        handle = ServiceProcess.start(
            name,
            fatura_command("run", name),
            env={**base_env, **env},
            log_path=log_dir / f"{name}-{len(started)}.log",
            cwd=ROOT,
        )
        handle.env = {**base_env, **env}
        started.append(handle)
        return handle

    yield start
    stop_all(started)


def start_edge(spawn: SpawnFn, workers: int = 2, *, wait: bool = True, **env: str) -> ServiceProcess:
    """The edge on ports of its own; ``wait=False`` returns at once (``wait_ready()`` later)."""
    # Every test talks to the edge from 127.0.0.1 and many send bad keys on purpose: the
    # failed-authentication throttle is off unless a test turns it on (test_keys does).
    env = {"FATURA_AUTH_FAILURE_LIMIT": "0", **env}
    port, metrics_port = free_port(), free_port()
    edge = spawn(
        "http",
        FATURA_HTTP_PORT=str(port),
        FATURA_HTTP_METRICS_PORT=str(metrics_port),
        FATURA_HTTP_WORKERS=str(workers),
        **env,
    )
    edge.base_url = f"http://127.0.0.1:{port}"
    edge.ready_url = f"{edge.base_url}/readyz"
    if wait:
        edge.wait_ready()
    return edge


# The limiter beside the session's edge: the operator's pool view (/v1/ops/limiter/pools) asks it.
EDGE_LIMITER_CONFIG = """
[pools.edge-a]
rpm = 600
tpm = 1000000
max_in_flight = 4

[pools.edge-b]
rpm = 60
tpm = 50000
max_in_flight = 2
"""


@pytest.fixture(scope="session")
def edge_limiter(spawn: SpawnFn, queue_prefix: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A limiter for the session's edge; returns its address."""
    config = tmp_path_factory.mktemp("edge-limiter") / "limiter.toml"
    config.write_text(EDGE_LIMITER_CONFIG)
    port, metrics_port = free_port(), free_port()
    limiter = spawn(
        "limiter",
        FATURA_LIMITER_PORT=str(port),
        FATURA_LIMITER_METRICS_PORT=str(metrics_port),
        FATURA_LIMITER_CONFIG=str(config),
        FATURA_LIMITER_KEY_PREFIX=f"fatura:test:{queue_prefix}:edge",
    )
    limiter.wait_ready(f"http://127.0.0.1:{metrics_port}/readyz")
    return f"127.0.0.1:{port}"


@pytest.fixture(scope="session")
def edge(spawn: SpawnFn, edge_limiter: str) -> ServiceProcess:
    """The HTTP edge with two uvicorn workers, as it runs in production, and a limiter beside it."""
    return start_edge(spawn, workers=2, FATURA_AUTH_CACHE_SECONDS="0", FATURA_LIMITER_ADDRESS=edge_limiter)


@pytest.fixture
def client(edge: ServiceProcess) -> Iterator[httpx.Client]:
    assert edge.base_url is not None
    with httpx.Client(base_url=edge.base_url, timeout=30.0) as c:
        yield c
