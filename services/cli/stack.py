"""Starting, supervising and stopping the local stack's processes (``fatura up``, ``fatura demo``,
``fatura chaos run``).

Every child is ``fatura run NAME`` in its own process group. A supervised child that exits is
started again after an exponential, jittered delay, like a process manager would: the delay
doubles with each exit that follows a short life and starts over once a child has stayed up for
``FATURA_RESTART_RESET_SECONDS``. Stopping the stack stops the supervision first, so nothing is
restarted while it goes down.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO

import pika
import psycopg
import redis
from pika.exceptions import AMQPError

from services.cli.processes import PROCESSES, ProcessSpec, by_name
from services.common.keyring import DEVELOPMENT_KEY
from services.common.procs import ChildProcess, answers, fatura_command, stop_all
from services.common.settings import CommonSettings, SettingsError, env_float

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
# Webhook secrets are sealed under a master key: locally, the well-known development one.
LOCAL_DEFAULTS = {"FATURA_EGRESS_ALLOW": "127.0.0.1/32,::1/128", "FATURA_SECRETS_KEY": DEVELOPMENT_KEY}


def apply_local_defaults() -> None:
    """Settings the local stack needs, unless the environment already says otherwise."""
    for name, value in LOCAL_DEFAULTS.items():
        os.environ.setdefault(name, value)


def apply_erp_ack_default() -> None:
    """The reference ERP of ``fatura up`` and ``fatura demo`` acknowledges what it posts to their
    edge (DESIGN §5.13), unless FATURA_ERP_ACK_URL says otherwise; the benches' ERP acknowledges
    nothing, so they measure delivery alone."""
    port = os.environ.get("FATURA_HTTP_PORT", "8080")
    os.environ.setdefault("FATURA_ERP_ACK_URL", f"http://127.0.0.1:{port}")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def ready_url(name: str) -> str | None:
    """Where to ask whether a process of the stack is ready, from that process's own settings."""
    return by_name(name).ready_url()


# ---------------------------------------------------------------------------------- restart policy


@dataclass(frozen=True)
class RestartPolicy:
    """How long a supervised child waits before it is started again (``FATURA_RESTART_*``)."""

    base_seconds: float = 1.0
    cap_seconds: float = 30.0
    # A child that stayed up this long before exiting is restarted after the base delay again.
    reset_after_seconds: float = 60.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RestartPolicy:
        env = os.environ if env is None else env
        base = env_float(env, "FATURA_RESTART_BASE_SECONDS", cls.base_seconds, lo=0.01, hi=3600)
        cap = env_float(env, "FATURA_RESTART_CAP_SECONDS", cls.cap_seconds, lo=0.01, hi=86_400)
        if cap < base:
            raise SettingsError(
                f"FATURA_RESTART_CAP_SECONDS={cap:g} is below FATURA_RESTART_BASE_SECONDS={base:g}"
            )
        reset = env_float(env, "FATURA_RESTART_RESET_SECONDS", cls.reset_after_seconds, lo=0.1, hi=86_400)
        return cls(base, cap, reset)

    def quick_exits(self, previous: int, uptime_seconds: float) -> int:
        """The count of exits in a row that followed a short life, this one included."""
        return 1 if uptime_seconds >= self.reset_after_seconds else previous + 1

    def delay(self, quick_exits: int, rng: random.Random) -> float:
        """Exponential in the exits in a row, capped, with jitter over its upper half: children that
        died together do not all come back in the same instant, and none comes back at once."""
        ceiling = min(self.cap_seconds, self.base_seconds * 2 ** min(max(quick_exits, 1) - 1, 40))
        return rng.uniform(ceiling / 2, ceiling)


# ---------------------------------------------------------------------------------- the supervisor


@dataclass(frozen=True)
class ChildSpec:
    """One child of a stack: a process of ``PROCESSES`` under a key of its own, with its settings."""

    key: str
    process: str
    env: Mapping[str, str] = field(default_factory=dict)
    ready_url: str | None = None  # None: the process's own, from the current environment
    supervised: bool = True


@dataclass(frozen=True)
class Restart:
    """A supervised child's exit and the restart it was given."""

    key: str
    exit_code: int
    uptime_seconds: float
    delay_seconds: float
    at: float  # wall-clock time of the exit
    deliberate: bool  # the stack's owner killed it (Stack.kill)


@dataclass
class Child:
    spec: ChildSpec
    proc: ChildProcess | None = None  # the current run; a restart replaces it
    started_at: float = 0.0
    quick_exits: int = 0
    restart_at: float | None = None  # monotonic time of the pending restart
    kill_requested: bool = False
    exit_code: int | None = None  # of an unsupervised child that has ended
    pids: list[int] = field(default_factory=list)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return None if self.proc is None else self.proc.process

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            return str(code)
    return str(code)


class Stack:
    """The stack's children, supervised by a thread of their own until ``stop``.

    ``names`` picks processes of ``PROCESSES`` with their own settings (``fatura up``); ``children``
    gives keys, settings and readiness URLs instead (several instances, private ports).
    """

    TICK_SECONDS = 0.1

    def __init__(
        self,
        names: Sequence[str] | None = None,
        *,
        children: Sequence[ChildSpec] | None = None,
        env: Mapping[str, str] | None = None,
        log: IO[str] | None = None,
        policy: RestartPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if children is None:
            children = [ChildSpec(p.name, p.name) for p in PROCESSES if names is None or p.name in names]
        self.specs: list[ProcessSpec] = [by_name(c.process) for c in children]
        self._children: dict[str, Child] = {}
        for spec in children:
            self._add_child(spec)
        self._env = dict(env or {})
        self._log = log
        self._policy = policy or RestartPolicy.from_env()
        self._rng = rng or random.Random()
        self._lock = threading.RLock()
        self._print_lock = threading.Lock()
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self._pumps: list[threading.Thread] = []
        self._width = max([len(k) for k in self._children] + [len("supervisor")])
        self.restarts: list[Restart] = []

    def _add_child(self, spec: ChildSpec) -> Child:
        if spec.key in self._children:
            raise ValueError(f"a child named {spec.key!r} is already in the stack")
        by_name(spec.process)  # an unknown process name fails here, not in the child
        child = Child(spec)
        self._children[spec.key] = child
        return child

    # ------------------------------------------------------------ starting and adding

    def start(self) -> None:
        """Start every child, then supervise them until ``stop``."""
        with self._lock:
            for child in self._children.values():
                if child.proc is None:
                    self._spawn(child)
        self._supervisor = threading.Thread(target=self._supervise, daemon=True, name="stack-supervisor")
        self._supervisor.start()

    def add(self, spec: ChildSpec) -> Child:
        """Start one more child now (for example a second worker, or one with a fault point set)."""
        with self._lock:
            if self._stopping.is_set():
                raise RuntimeError("the stack is stopping")
            child = self._add_child(spec)
            self._width = max(self._width, len(spec.key))
            self._spawn(child)
            return child

    def _spawn(self, child: Child) -> None:
        # Without a log file its output comes through a pipe, each line printed under its key.
        proc = ChildProcess.start(
            child.spec.key,
            fatura_command("run", child.spec.process),
            env={**self._env, **child.spec.env},
        )
        child.proc, child.started_at, child.restart_at = proc, time.monotonic(), None
        child.pids.append(proc.pid)
        thread = threading.Thread(
            target=self._pump, args=(child.spec.key, proc.process), daemon=True, name=f"pump-{child.spec.key}"
        )
        thread.start()
        self._pumps.append(thread)

    def _pump(self, key: str, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        for raw in iter(process.stdout.readline, b""):
            self._print(key, raw.decode("utf-8", errors="replace").rstrip())

    def _print(self, key: str, line: str) -> None:
        with self._print_lock:
            target = self._log if self._log is not None else sys.stdout
            print(f"{key.ljust(self._width)} | {line}", file=target, flush=True)

    # ------------------------------------------------------------ supervision

    def _supervise(self) -> None:
        while not self._stopping.wait(self.TICK_SECONDS):
            with self._lock:
                if self._stopping.is_set():
                    return
                for child in self._children.values():
                    try:
                        self._look_after(child)
                    except OSError as exc:  # no fork today (limits, memory): try again later
                        child.restart_at = time.monotonic() + self._policy.cap_seconds
                        text = f"{child.spec.key} could not be started ({exc}); trying again"
                        self._print("supervisor", text)

    def _look_after(self, child: Child) -> None:
        now = time.monotonic()
        if child.proc is None:
            return
        if child.restart_at is not None:
            if now >= child.restart_at:
                self._spawn(child)
                self._print("supervisor", f"{child.spec.key} restarted (pid {child.pid})")
            return
        code = child.proc.returncode
        if code is None or child.exit_code is not None:
            return
        child.proc.signal_group(signal.SIGKILL)  # whatever it forked goes with it
        deliberate, child.kill_requested = child.kill_requested, False
        uptime = now - child.started_at
        if not child.spec.supervised:
            child.exit_code = code
            text = f"{child.spec.key} exited with code {describe_exit(code)} (not restarted)"
            self._print("supervisor", text)
            return
        child.quick_exits = self._policy.quick_exits(child.quick_exits, uptime)
        delay = self._policy.delay(child.quick_exits, self._rng)
        child.restart_at = now + delay
        restart = Restart(child.spec.key, code, uptime, delay, time.time(), deliberate)
        self.restarts.append(restart)
        self._print(
            "supervisor",
            f"{child.spec.key} (pid {child.proc.pid}) exited with code {describe_exit(code)} after "
            f"{uptime:.1f}s; restarting in {delay:.2f}s (restart #{self.restart_count(child.spec.key)}"
            f"{', killed on purpose' if deliberate else ''})",
        )

    # ------------------------------------------------------------ what the owner asks

    @property
    def keys(self) -> list[str]:
        with self._lock:
            return list(self._children)

    def child(self, key: str) -> Child:
        with self._lock:
            return self._children[key]

    def pid(self, key: str) -> int | None:
        with self._lock:
            child = self._children[key]
            return child.pid if child.alive() else None

    def kill(self, key: str, sig: signal.Signals = signal.SIGKILL) -> int | None:
        """Signal a child's process group on purpose; its restart is counted as deliberate.
        Returns the pid signalled, or None when the child was not running."""
        with self._lock:
            child = self._children[key]
            if not child.alive() or child.proc is None:
                return None
            child.kill_requested = True
            child.proc.signal_group(sig)
            return child.proc.pid

    def restart_count(self, key: str) -> int:
        return sum(1 for r in self.restarts if r.key == key)

    def unexpected_restarts(self) -> list[Restart]:
        """Restarts of children that exited on their own, not because the owner killed them."""
        return [r for r in self.restarts if not r.deliberate]

    def wait_ready(
        self,
        timeout: float = 60.0,
        progress: Callable[[str, bool], None] | None = None,
        keys: Sequence[str] | None = None,
    ) -> list[str]:
        """Wait until every child (or those of ``keys``) answers its readiness URL; returns the keys
        that never did. A supervised child that exits meanwhile is restarted and waited for."""
        deadline = time.monotonic() + timeout
        pending = set(self.keys if keys is None else keys)
        while pending and time.monotonic() < deadline:
            for key in sorted(pending):
                if self.is_ready(key):
                    pending.discard(key)
                    if progress is not None:
                        progress(key, True)
            if pending:
                time.sleep(0.2)
        return sorted(pending)

    def is_ready(self, key: str) -> bool:
        child = self.child(key)
        if not child.alive():
            return False
        url = child.spec.ready_url if child.spec.ready_url is not None else ready_url(child.spec.process)
        return url is None or answers(url)

    def stop(self, grace: float = 10.0) -> None:
        """Stop supervising, then SIGTERM every child's process group (in reverse start order) and
        SIGKILL the ones still there after ``grace`` seconds."""
        with self._lock:
            self._stopping.set()
            children = list(self._children.values())
        if self._supervisor is not None:
            self._supervisor.join()
        # Only the ones still running: the group of a child that ended was killed when it ended.
        # SIGKILL to the late ones, and to anything a child forked.
        stop_all([c.proc for c in reversed(children) if c.alive() and c.proc is not None], grace)
        for thread in self._pumps:
            thread.join(timeout=2.0)
