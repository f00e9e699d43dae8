"""The processes a benchmark starts: loopback ports nobody holds, ``fatura`` commands as children in
process groups of their own, waiting until they are ready, and stopping them by pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback port no one listens on right now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str) -> bool:
    """The URL answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Proc:
    """A ``fatura`` child; a context manager that stops it when the block ends."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready_url: str

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def wait_ready(self, timeout: float = 60.0) -> Proc:
        """Until its ``ready_url`` answers 200; one that exits first or is not ready within ``timeout``
        is stopped, and the run ends with the name of its log."""
        deadline = time.monotonic() + timeout
        while not answers(self.ready_url):
            if not self.alive() or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"{self.name} did not become ready; see {self.log_path}")
            time.sleep(0.1)
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the process (the edge's uvicorn supervisor stops its own workers), SIGKILL to its
        group when it has not exited within ``timeout``, and to any child it left behind."""
        if self.alive():
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:  # the group is gone: nothing was left behind
            pass
        self.popen.wait()

    def __enter__(self) -> Proc:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(name: str, command: Sequence[str], log_path: Path, env: Mapping[str, str], ready_url: str) -> Proc:
    """Start ``fatura COMMAND`` with ``env`` over this process's, its output in ``log_path``; it is
    ready when ``ready_url`` answers 200."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("wb") as log:
        popen = subprocess.Popen(
            [sys.executable, "-m", "services.cli.main", *command],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: whatever it forks stops with it
        )
    return Proc(name, popen, log_path, ready_url)


def spawn(name: str, command: Sequence[str], log_path: Path, env: Mapping[str, str], ready_url: str) -> Proc:
    """``start``, then wait until it is ready."""
    return start(name, command, log_path, env, ready_url).wait_ready()
