"""Starting, watching and stopping the local stack's processes (used by ``fatura up`` and ``fatura demo``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import IO

import httpx
import pika
import psycopg
import redis
from pika.exceptions import AMQPError

from services.cli.processes import PROCESSES, ProcessSpec, by_name
from services.common.settings import CommonSettings

START_COMMANDS = {
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "RabbitMQ": "rabbitmq-server -detached",
    "Redis": 'redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no '
    "--dir /var/lib/redis --logfile /var/log/redis/ci.log",
}


def check_dependencies(settings: CommonSettings) -> list[str]:
    """One line per dependency that does not answer, saying how to start it; empty when all answer."""
    problems: list[str] = []
    try:
        with psycopg.connect(settings.database_url, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):  # the server answers; `fatura migrate` creates the database
            problems.append(
                f"PostgreSQL does not answer ({_first_line(exc)}). "
                f"Start it with: {START_COMMANDS['PostgreSQL']}"
            )
    try:
        params = pika.URLParameters(settings.amqp_url)
        params.socket_timeout = 3
        params.blocked_connection_timeout = 3
        params.connection_attempts = 1
        pika.BlockingConnection(params).close()
    except (AMQPError, OSError) as exc:
        problems.append(
            f"RabbitMQ does not answer ({type(exc).__name__}). Start it with: {START_COMMANDS['RabbitMQ']}"
        )
    try:
        client = redis.Redis.from_url(settings.redis_url, socket_timeout=3, socket_connect_timeout=3)
        client.ping()
        client.close()
    except redis.RedisError as exc:
        problems.append(
            f"Redis does not answer ({_first_line(exc)}). Start it with: {START_COMMANDS['Redis']}"
        )
    return problems


# The local stack delivers webhooks to the reference ERP on this machine: the egress guard refuses
# private and loopback targets unless the allow-list names them (DESIGN §5.10).
LOCAL_DEFAULTS = {"FATURA_EGRESS_ALLOW": "127.0.0.1/32,::1/128"}


def apply_local_defaults() -> None:
    """Settings the local stack needs, unless the environment already says otherwise."""
    for name, value in LOCAL_DEFAULTS.items():
        os.environ.setdefault(name, value)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def ready_url(name: str) -> str | None:
    """Where to ask whether a process of the stack is ready, from that process's own settings."""
    return by_name(name).ready_url()


@dataclass
class Running:
    spec: ProcessSpec
    process: subprocess.Popen[bytes]


class Stack:
    """Child processes of the stack; each is started with ``fatura run NAME`` in its own process group."""

    def __init__(self, names: Sequence[str] | None = None, *, log: IO[str] | None = None) -> None:
        self.specs = [p for p in PROCESSES if names is None or p.name in names]
        self.running: list[Running] = []
        self._log = log
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        width = max(len(s.name) for s in self.specs)
        for spec in self.specs:
            process = subprocess.Popen(
                [sys.executable, "-m", "services.cli.main", "run", spec.name],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.running.append(Running(spec, process))
            thread = threading.Thread(
                target=self._pump,
                args=(spec.name.ljust(width), process),
                daemon=True,
                name=f"pump-{spec.name}",
            )
            thread.start()
            self._threads.append(thread)

    def _pump(self, label: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            line = raw.decode("utf-8", errors="replace").rstrip()
            with self._lock:
                target = self._log if self._log is not None else sys.stdout
                print(f"{label} | {line}", file=target, flush=True)

    def wait_ready(
        self, timeout: float = 60.0, progress: Callable[[str, bool], None] | None = None
    ) -> list[str]:
        """Wait until every process answers its readiness URL; returns the names that never did."""
        deadline = time.monotonic() + timeout
        pending = {r.spec.name for r in self.running}
        while pending and time.monotonic() < deadline:
            for r in self.running:
                if r.spec.name not in pending:
                    continue
                if r.process.poll() is not None:
                    return [f"{r.spec.name} exited with code {r.process.returncode}"]
                url = ready_url(r.spec.name)
                try:
                    ok = url is None or httpx.get(url, timeout=1.0).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    pending.discard(r.spec.name)
                    if progress is not None:
                        progress(r.spec.name, True)
            time.sleep(0.2)
        return sorted(pending)

    def first_exit(self) -> Running | None:
        for r in self.running:
            if r.process.poll() is not None:
                return r
        return None

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every child's process group (in reverse start order), then SIGKILL stragglers."""
        for r in reversed(self.running):
            if r.process.poll() is None:
                try:
                    os.killpg(r.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for r in reversed(self.running):
            try:
                r.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(r.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                r.process.wait()
        for thread in self._threads:
            thread.join(timeout=2.0)
