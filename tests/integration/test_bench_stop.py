"""A benchmark stopped with SIGTERM (``kill``, ``timeout``) stops the processes it started, as it
does on Ctrl-C, instead of leaving them running on a shared machine."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child that has exited but is not reaped yet is a zombie: gone for this purpose.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_benchmark_stopped_with_sigterm_stops_the_limiter_it_started() -> None:
    # Given a running limiter benchmark that has started a limiter of its own
    bench = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "bench", "limiter", "--duration", "60", "--warmup", "1"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    limiter = 0
    try:
        assert bench.stdout is not None
        started = None
        deadline = time.monotonic() + 60
        while started is None and time.monotonic() < deadline:
            line = bench.stdout.readline()
            if not line:
                break
            started = re.search(r"started a limiter \(pid (\d+)\)", line)
        assert started is not None, "the benchmark never said it started a limiter"
        limiter = int(started.group(1))
        assert _alive(limiter)
        # When it is sent SIGTERM
        bench.send_signal(signal.SIGTERM)
        bench.communicate(timeout=60)
        # Then the limiter it started is gone too
        deadline = time.monotonic() + 30
        while _alive(limiter) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(limiter), f"the benchmark's limiter (pid {limiter}) outlived it"
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        if limiter and _alive(limiter):  # started by this test's benchmark: never left behind
            os.kill(limiter, signal.SIGKILL)
