"""The seed's global-cap problem: three pods with a semaphore of 30 each let 90 calls through at
once. Through the limiter, three client processes of 30 threads never hold more than 30 permits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from tests.limiter.conftest import SHARED_REDIS_URL

if TYPE_CHECKING:
    from tests.limiter.conftest import LimiterProcess

WORKER = Path(__file__).with_name("limiter_worker.py")


def race(limiter: LimiterProcess, *extra: str, processes: int = 3, threads: int = 30) -> list[dict[str, int]]:
    counter_key = f"fatura:test:race:{uuid.uuid4().hex}"
    start_at = time.time() + 2.0  # every process starts together, after its imports
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(WORKER),
                "race",
                limiter.address,
                "race",
                "--redis-url",
                SHARED_REDIS_URL,
                "--counter-key",
                counter_key,
                "--threads",
                str(threads),
                "--seconds",
                "3",
                "--start-at",
                str(start_at),
                *extra,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    try:
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        redis.Redis.from_url(SHARED_REDIS_URL).delete(counter_key)
    assert all(proc.returncode == 0 for proc in procs), outputs
    return [json.loads(out) for out in outputs]


def test_three_processes_of_30_threads_never_hold_more_than_30_permits(
    shared_limiter: LimiterProcess,
) -> None:
    """Given a pool with max in-flight 30 and three client processes x 30 threads racing for it
    When each thread takes a permit, holds it for a few milliseconds and releases it, for 3 s
    Then the most permits held at once, counted by the clients themselves, is at most 30,
    and the race was real: the cap was reached and many permits went through."""
    results = race(shared_limiter)
    peak = max(r["peak"] for r in results)
    assert peak <= 30, results
    assert peak >= 25, results  # 90 threads contended: the pool was saturated, not idle
    assert all(r["grants"] > 0 and r["denials"] > 0 and r["errors"] == 0 for r in results), results
    with shared_limiter.client() as client:
        assert client.pool_status("race").in_flight.used == 0  # every permit was given back


def test_control_per_process_semaphores_of_30_overshoot_the_global_cap(
    shared_limiter: LimiterProcess,
) -> None:
    """Control for the harness above: with the seed's per-pod semaphore of 30 instead of the
    limiter, the same three processes hold more than 30 at once. The race test can fail."""
    results = race(shared_limiter, "--local-semaphore", "30")
    assert max(r["peak"] for r in results) > 30, results
