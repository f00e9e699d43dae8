"""Fixtures for the limiter tests: real Redis, the limiter server as a real process, and a private
``redis-server`` that a test may kill and restart without touching the shared one.

Every limiter started here uses Redis db 14 and a key prefix of its own, so tests never see a
running demo's permits (db 0) nor each other's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.common.procs import ChildProcess, free_port
from services.limiter.client import LimiterClient

ROOT = Path(__file__).resolve().parents[2]
TEST_DB = 14
SHARED_REDIS_URL = f"redis://127.0.0.1:6379/{TEST_DB}"

# Pools for the tests that share one limiter; each test uses its own pool so none sees another's
# permits. Small windows make window boundaries reachable within a test.
SHARED_CONFIG = """
[pools.basic]
pacing = "window"
rpm = 1000
tpm = 1000000
max_in_flight = 10

[pools.atomic]
pacing = "window"
rpm = 1000
tpm = 1000
max_in_flight = 1

[pools.rpm]
pacing = "window"
rpm = 5
tpm = 1000000000
max_in_flight = 100
window_ms = 1000

[pools.kill]
pacing = "window"
rpm = 1000
tpm = 1000000000
max_in_flight = 2

[pools.cool]
pacing = "window"
rpm = 1000
tpm = 1000000000
max_in_flight = 100

[pools.tpm]
pacing = "window"
rpm = 100000
tpm = 1000000000
max_in_flight = 1000

[pools.race]
rpm = 100000000
tpm = 1000000000000
max_in_flight = 30

[pools.later]
pacing = "window"
rpm = 100000
tpm = 1000000000
max_in_flight = 1

[pools.tenants]
pacing = "window"
rpm = 1000
tpm = 1000000000
max_in_flight = 100

[tenants.capped]
max_in_flight = 1

[tenants.budgeted]
daily_token_budget = 10000
"""


def delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url, socket_timeout=2)
    try:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@dataclass
class LimiterProcess:
    child: ChildProcess
    port: int
    metrics_port: int
    config_path: Path
    key_prefix: str
    redis_url: str
    token: str | None = None  # the FATURA_LIMITER_TOKEN it was started with
    credentials: Any = None  # grpc.ChannelCredentials for a TLS limiter; None: plaintext

    @property
    def process(self) -> subprocess.Popen[bytes]:
        return self.child.process

    @property
    def log_path(self) -> Path | None:
        return self.child.log_path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def log(self) -> str:
        return self.child.log()

    def alive(self) -> bool:
        return self.child.alive()

    def client(self, **kwargs: object) -> LimiterClient:
        """A client with the limiter's own token and TLS credentials unless told otherwise."""
        kwargs.setdefault("deadline_ms", 2_000)  # generous: the machine is shared, tests never time
        kwargs.setdefault("token", self.token)
        kwargs.setdefault("credentials", self.credentials)
        return LimiterClient(self.address, **kwargs)  # type: ignore[arg-type]

    def channel(self) -> grpc.Channel:
        if self.credentials is None:
            return grpc.insecure_channel(self.address)
        return grpc.secure_channel(self.address, self.credentials)

    def health(self, service: str = "") -> int:
        """The standard health service's answer; it needs no token."""
        with self.channel() as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2)
            return int(response.status)

    def wait_health(self, status: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise AssertionError(f"limiter exited with {self.process.returncode}:\n{self.log()}")
            try:
                last = self.health()
                if last == status:
                    return
            except grpc.RpcError as exc:
                last = exc.code()
            time.sleep(0.1)
        raise AssertionError(f"limiter health stayed {last}, wanted {status}:\n{self.log()}")

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> int:
        return self.child.stop(grace=15)


def spawn_limiter(
    config: str,
    workdir: Path,
    *,
    redis_url: str = SHARED_REDIS_URL,
    env: dict[str, str] | None = None,
    credentials: Any = None,
) -> LimiterProcess:
    """Run ``python -m services.limiter.server`` (what ``fatura run limiter`` calls) on free ports."""
    name = uuid.uuid4().hex[:12]
    config_path = workdir / f"limiter-{name}.toml"
    config_path.write_text(config)
    log_path = workdir / f"limiter-{name}.log"
    port, metrics_port = free_port(), free_port()
    prefix = f"fatura:test:{name}"
    full_env = {
        "FATURA_REDIS_URL": redis_url,
        "FATURA_LIMITER_CONFIG": str(config_path),
        "FATURA_LIMITER_PORT": str(port),
        "FATURA_LIMITER_METRICS_PORT": str(metrics_port),
        "FATURA_LIMITER_KEY_PREFIX": prefix,
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    command = [sys.executable, "-m", "services.limiter.server"]
    child = ChildProcess.start("limiter", command, env=full_env, log_path=log_path, cwd=ROOT)
    token = {**os.environ, **full_env}.get("FATURA_LIMITER_TOKEN") or None
    return LimiterProcess(child, port, metrics_port, config_path, prefix, redis_url, token, credentials)


def _teardown(limiter: LimiterProcess) -> None:
    limiter.stop()
    try:
        delete_prefix(limiter.redis_url, limiter.key_prefix)
    except redis.RedisError:
        pass  # a private Redis that the test left stopped


StartLimiter = Callable[..., LimiterProcess]


@pytest.fixture
def start_limiter(tmp_path: Path) -> Iterator[StartLimiter]:
    """Start limiter server processes; each is stopped (SIGTERM, by pid) and its keys deleted at teardown."""
    started: list[LimiterProcess] = []

    def start(
        config: str,
        *,
        redis_url: str = SHARED_REDIS_URL,
        env: dict[str, str] | None = None,
        serving: bool = True,
        credentials: Any = None,
    ) -> LimiterProcess:
        """``credentials``: what the test's clients use to reach a TLS limiter."""
        limiter = spawn_limiter(config, tmp_path, redis_url=redis_url, env=env, credentials=credentials)
        started.append(limiter)
        if serving:
            limiter.wait_health(health_pb2.HealthCheckResponse.SERVING)
        return limiter

    yield start
    for limiter in reversed(started):
        _teardown(limiter)


@pytest.fixture(scope="module")
def shared_limiter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimiterProcess]:
    """One limiter for the tests of a module, with the pools of ``SHARED_CONFIG``."""
    limiter = spawn_limiter(SHARED_CONFIG, tmp_path_factory.mktemp("shared-limiter"))
    try:
        limiter.wait_health(health_pb2.HealthCheckResponse.SERVING)
        yield limiter
    finally:
        _teardown(limiter)


@dataclass
class PrivateRedis:
    """A redis-server this test owns: started, SIGKILLed and restarted by pid on a fixed port."""

    port: int
    workdir: Path
    child: ChildProcess | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return None if self.child is None else self.child.process

    def start(self) -> None:
        assert self.child is None or not self.child.alive()
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(self.workdir)]
        self.child = ChildProcess.start(
            "private redis-server", command, log_path=self.workdir / f"redis-{self.port}.log"
        )
        self.child.wait_accepting(self.port, timeout=10)

    def kill(self) -> None:
        if self.child is not None and self.child.alive():
            self.child.kill()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed; the Redis-outage tests need it")
    server = PrivateRedis(port=free_port(), workdir=tmp_path)
    server.start()
    yield server
    server.kill()
