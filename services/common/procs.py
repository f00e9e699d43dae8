"""Child processes on this machine: a loopback port nobody holds, asking whether a URL or a port
answers, and a child started in a process group of its own, waited for until it is ready and
stopped by pid (SIGTERM to its group, SIGKILL after a grace). ``fatura up``, the chaos runner, the
benchmarks and the tests all start their children through here.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self

import httpx

LOG_TAIL_LINES = 60


# The ports this process handed out from FATURA_PORT_RANGE lately: not handed out again while their
# servers may still be starting (one bound since is refused by the bind check anyway).
_RECENT: OrderedDict[int, None] = OrderedDict()
_RECENT_LOCK = threading.Lock()
_RECENT_MAX = 256


def free_port(host: str = "127.0.0.1") -> int:
    """A port no one listens on right now: the kernel's pick, or with ``FATURA_PORT_RANGE=LO-HI`` one
    from that range that this process has not handed out lately.

    The kernel picks from its ephemeral range, which every outgoing connection and every other
    process's pick draw from too, so a port handed out here can be taken before its server binds it.
    The test suite gives each of its pytest processes a range of its own below the ephemeral one.
    """
    span = os.environ.get("FATURA_PORT_RANGE", "").strip()
    if not span:
        with socket.socket(_family(host)) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    lo, hi = _port_range(span)
    remember = max(1, min(_RECENT_MAX, (hi - lo + 1) // 2))
    with _RECENT_LOCK:
        for _ in range(4 * (hi - lo + 1)):
            port = random.randint(lo, hi)
            if port in _RECENT:
                continue
            with socket.socket(_family(host)) as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            _RECENT[port] = None
            while len(_RECENT) > remember:
                _RECENT.popitem(last=False)
            return port
    raise RuntimeError(f"no free port found in FATURA_PORT_RANGE={span}")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _port_range(span: str) -> tuple[int, int]:
    try:
        lo, hi = (int(part) for part in span.split("-"))
    except ValueError:
        raise ValueError(f"FATURA_PORT_RANGE must be LO-HI (two port numbers), not {span!r}") from None
    if not 1024 <= lo <= hi <= 65535:
        raise ValueError(f"FATURA_PORT_RANGE must lie within 1024-65535, low end first, not {span!r}")
    return lo, hi


def status(url: str, timeout: float = 1.0) -> int:
    """The HTTP status a GET of ``url`` answers with; 0 when nothing answers within ``timeout``."""
    try:
        return httpx.get(url, timeout=timeout).status_code
    except httpx.HTTPError:
        return 0


def answers(url: str, timeout: float = 1.0) -> bool:
    """``url`` answers 200 within ``timeout`` (a ``/readyz`` that says ready)."""
    return status(url, timeout) == 200


def accepts(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def fatura_command(*args: str) -> list[str]:
    """``fatura ARGS`` run by this interpreter, as the children of the stack are."""
    return [sys.executable, "-m", "services.cli.main", *args]


class NotReady(RuntimeError):
    """A child exited, or did not answer its readiness check in time; the message says which, with
    the end of its log."""


@dataclass(eq=False)
class ChildProcess:
    """A child in a process group of its own. Its output goes to ``log_path``, or to a pipe
    (``process.stdout``) the owner reads when there is none."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path | None = None
    ready_url: str | None = None

    @classmethod
    def start(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
        ready_url: str | None = None,
    ) -> Self:
        """Run ``command`` with ``env`` over this process's environment, stdout and stderr into
        ``log_path`` (created with its folder), or into a pipe when it is None."""
        popen_env = {**os.environ, **(env or {})}
        if log_path is None:
            process = _popen(command, popen_env, cwd, subprocess.PIPE)
        else:
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with log_path.open("wb") as log:
                process = _popen(command, popen_env, cwd, log)
        return cls(name, process, log_path, ready_url)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.poll()

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def wait_ready(self, url: str | None = None, timeout: float = 30.0) -> Self:
        """Until ``url`` (or ``ready_url``) answers 200; raises ``NotReady`` when the child exits
        first or is not ready within ``timeout``. The child is left as it is."""
        url = url or self.ready_url
        if url is None:
            raise ValueError(f"{self.name} has no readiness URL")
        return self.wait_until(lambda: answers(url), f"ready at {url}", timeout)

    def wait_accepting(self, port: int, host: str = "127.0.0.1", timeout: float = 30.0) -> Self:
        """Until the child accepts TCP connections on ``host:port`` (``wait_ready`` otherwise)."""
        return self.wait_until(lambda: accepts(port, host), f"accepting on {host}:{port}", timeout)

    def wait_until(self, ready: Callable[[], bool], what: str, timeout: float) -> Self:
        deadline = time.monotonic() + timeout
        while not ready():
            if not self.alive():
                raise NotReady(self._report(f"exited with code {self.process.returncode}"))
            if time.monotonic() > deadline:
                raise NotReady(self._report(f"was not {what} within {timeout:g}s"))
            time.sleep(0.1)
        return self

    def _report(self, what: str) -> str:
        where = f"; its log is {self.log_path}" if self.log_path is not None else ""
        tail = self.log_tail()
        return f"{self.name} {what}{where}" + (f"; its last lines:\n{tail}" if tail else "")

    def signal_group(self, sig: int) -> None:
        """Signal the child's process group (it and whatever it forked); nothing when it is gone."""
        try:
            os.killpg(self.process.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """SIGTERM to the group of a child that is still running (``finish`` waits for it)."""
        if self.alive():
            self.signal_group(signal.SIGTERM)

    def finish(self, deadline: float) -> int:
        """Wait until the monotonic ``deadline`` for the child to exit, SIGKILL its group if it has
        not, and SIGKILL whatever it forked that outlived it; returns its exit code."""
        try:
            return self._reap(self.process.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            self.overdue()
            self.signal_group(signal.SIGKILL)
            return self._reap(self.process.wait())

    def overdue(self) -> None:
        """Called when the child is still running at ``finish``'s deadline, before the SIGKILL."""

    def _reap(self, code: int) -> int:
        self.signal_group(signal.SIGKILL)
        return code

    def stop(self, grace: float = 15.0) -> int:
        """SIGTERM to the group, SIGKILL after ``grace`` seconds; returns the exit code."""
        self.terminate()
        return self.finish(time.monotonic() + grace)

    def kill(self) -> int:
        """SIGKILL to the group at once; returns the exit code."""
        self.signal_group(signal.SIGKILL)
        return self.process.wait()

    def wait_exit(self, timeout: float) -> int:
        return self.process.wait(timeout=timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_all(children: Sequence[ChildProcess], grace: float = 15.0) -> None:
    """Stop ``children`` together: SIGTERM to every group still running, then wait for each until
    one shared deadline ``grace`` seconds away (SIGKILL to the late). Each drains at once, so the
    whole stop takes the slowest one's time, not the sum of theirs."""
    running = [child for child in children if child.alive()]
    for child in running:
        child.terminate()
    deadline = time.monotonic() + grace
    for child in running:
        child.finish(deadline)


def _popen(
    command: Sequence[str], env: Mapping[str, str], cwd: Path | None, stdout: int | IO[Any]
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(command),
        cwd=cwd,
        env=dict(env),
        stdout=stdout,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group: whatever it forks stops with it
    )
