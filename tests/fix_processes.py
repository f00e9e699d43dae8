"""Fixtures that run the stack's processes for real (``fatura run NAME``) and end them by pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    base_url: str | None = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 15.0) -> int:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.process.wait()

    def kill(self) -> None:
        if self.alive():
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def wait_ready(self, url: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.name} was not ready at {url} within {timeout}s:\n{self.log()}")


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
        full_env = {**os.environ, **base_env, **env}
        log_path = log_dir / f"{name}-{len(started)}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.cli.main", "run", name],
                cwd=ROOT,
                env=full_env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        handle = ServiceProcess(name, process, log_path, {**base_env, **env})
        started.append(handle)
        return handle

    yield start
    for handle in started:
        if handle.alive():
            handle.stop()


def start_edge(spawn: SpawnFn, workers: int = 2, **env: str) -> ServiceProcess:
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
    edge.wait_ready(f"{edge.base_url}/readyz")
    return edge


@pytest.fixture(scope="session")
def edge(spawn: SpawnFn) -> ServiceProcess:
    """The HTTP edge with two uvicorn workers, as it runs in production."""
    return start_edge(spawn, workers=2, FATURA_AUTH_CACHE_SECONDS="0")


@pytest.fixture
def client(edge: ServiceProcess) -> Iterator[httpx.Client]:
    assert edge.base_url is not None
    with httpx.Client(base_url=edge.base_url, timeout=30.0) as c:
        yield c
