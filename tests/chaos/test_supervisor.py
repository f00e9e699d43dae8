"""``fatura up`` supervises like a process manager: a child killed by SIGKILL comes back, and
stopping the supervisor (Ctrl-C or SIGTERM) leaves no child behind and restarts nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fix_processes import ROOT
from services.common.procs import free_port

pytestmark = pytest.mark.chaos


class Up:
    """``fatura up --only erp,provider`` on private ports, its output read line by line."""

    def __init__(self, database_url: str, tmp: Path) -> None:
        self.erp_port, self.provider_port = free_port(), free_port()
        env = {
            **os.environ,
            "FATURA_DATABASE_URL": database_url,
            "FATURA_ERP_PORT": str(self.erp_port),
            "FATURA_ERP_DB": str(tmp / "erp.sqlite"),
            "FATURA_SANDBOX_PROVIDER_PORT": str(self.provider_port),
            "FATURA_RESTART_BASE_SECONDS": "0.2",
            "FATURA_RESTART_CAP_SECONDS": "1",
            "PYTHONUNBUFFERED": "1",
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", "up", "--only", "erp,provider"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in iter(self.process.stdout.readline, b""):
            with self._changed:
                self.lines.append(raw.decode(errors="replace").rstrip())
                self._changed.notify_all()

    def wait_line(self, pattern: str, timeout: float = 60.0, after: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines[after:]:
                    found = re.search(pattern, line)
                    if found:
                        return found
                left = deadline - time.monotonic()
                if left <= 0 or self.process.poll() is not None:
                    raise AssertionError(f"no line matching {pattern!r}:\n" + "\n".join(self.lines))
                self._changed.wait(min(left, 0.5))

    def erp_pid(self) -> int | None:
        try:
            return int(httpx.get(f"http://127.0.0.1:{self.erp_port}/admin/stats", timeout=1.0).json()["pid"])
        except httpx.HTTPError:
            return None

    def wait_erp_pid(self, other_than: int | None = None, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.erp_pid()
            if pid is not None and pid != other_than:
                return pid
            time.sleep(0.1)
        raise AssertionError("the ERP did not answer:\n" + "\n".join(self.lines))

    def child_pids(self) -> set[int]:
        """Every pid the supervisor said it started."""
        pids = set()
        for line in self.lines:
            pids |= {int(p) for p in re.findall(r"\(pid (\d+)\)", line)}
        return pids

    def end(self) -> None:
        """Stop the supervisor as a user would; then make sure none of its children outlives it."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        for pid in self.child_pids():
            if _alive(pid) and b"services.cli.main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.killpg(pid, signal.SIGKILL)


@pytest.fixture
def up(database_url: str, tmp_path: Path) -> Iterator[Up]:
    handle = Up(database_url, tmp_path)
    yield handle
    handle.end()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pids: set[int], timeout: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return {p for p in pids if _alive(p)}


def test_a_child_killed_with_sigkill_is_restarted_and_the_restart_is_logged(up: Up) -> None:
    # Given the supervised stack, with the ERP answering
    up.wait_line(r"fatura up: started erp \(pid \d+\)")
    first = up.wait_erp_pid()
    # When the ERP process is killed by its pid
    os.kill(first, signal.SIGKILL)
    # Then the supervisor logs the exit code and the delay, and a new ERP answers
    found = up.wait_line(r"erp \(pid (\d+)\) exited with code -9 \(SIGKILL\) .*restarting in ([\d.]+)s")
    assert int(found.group(1)) == first
    assert float(found.group(2)) > 0
    up.wait_line(r"erp restarted \(pid \d+\)")
    second = up.wait_erp_pid(other_than=first)
    assert second != first and _alive(second)
    # And SIGTERM to the supervisor ends every child it ever started, restarting none of them
    pids = up.child_pids()
    stopping = len(up.lines)
    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(timeout=60) == 0
    assert _wait_gone(pids) == set()
    assert not [line for line in up.lines[stopping:] if "restart" in line and "stopped" not in line]
    assert "fatura up: stopped (1 restart while running)" in up.lines


def test_ctrl_c_stops_every_child_without_restarting_any(up: Up) -> None:
    # Given the supervised stack, running
    up.wait_line(r"fatura up: started erp \(pid \d+\), provider \(pid \d+\)")
    up.wait_erp_pid()
    pids = up.child_pids()
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    # When it gets Ctrl-C
    stopping = len(up.lines)
    up.process.send_signal(signal.SIGINT)
    # Then it exits, every child is gone, and nothing was restarted on the way down
    assert up.process.wait(timeout=60) == 0
    assert _wait_gone(pids) == set()
    assert not [line for line in up.lines[stopping:] if "restarting in" in line or "restarted" in line]
