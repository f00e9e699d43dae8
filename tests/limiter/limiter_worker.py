"""A client process for the limiter tests (run as ``python tests/limiter/limiter_worker.py MODE ...``).

hold: take N permits, print them as one JSON line, then sleep until killed.
race: THREADS threads take and release permits for SECONDS; each holder bumps a Redis counter
      after its grant and drops it before its release, so the counter's peak is a lower bound of
      the permits held at once across every process. ``--local-semaphore N`` replaces the limiter
      with a per-process semaphore (the seed's per-pod limit) to show the harness sees overshoot.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from services.limiter.client import LimiterClient
from services.limiter.errors import LimiterError
from services.limiter.model import Grant, Outcome


def hold(args: argparse.Namespace) -> int:
    client = LimiterClient(args.address, deadline_ms=5_000)
    held = []
    for _ in range(args.count):
        result = client.acquire(args.pool, "holder", 10, 10, lease_ms=args.lease_ms)
        if not isinstance(result, Grant):
            print(json.dumps({"error": repr(result)}), flush=True)
            return 1
        held.append({"permit_id": result.permit_id, "lease_expires_at_ms": result.lease_expires_at_ms})
    print(json.dumps({"held": held}), flush=True)
    while True:
        time.sleep(60)


def race(args: argparse.Namespace) -> int:
    counter = redis.Redis.from_url(args.redis_url)
    client = LimiterClient(args.address, deadline_ms=30_000)  # a loaded machine is slow, not broken
    local = threading.BoundedSemaphore(args.local_semaphore) if args.local_semaphore else None
    lock = threading.Lock()
    totals = {"grants": 0, "denials": 0, "peak": 0, "errors": 0}
    start_at = float(args.start_at)
    while time.time() < start_at:  # every process starts racing at the same moment
        time.sleep(0.001)
    stop_at = start_at + args.seconds

    def take() -> str | None:
        if local is not None:
            return "local" if local.acquire(timeout=0.05) else None
        result = client.acquire(args.pool, f"tenant-{random.randrange(5)}", 100, 100, lease_ms=30_000)
        return result.permit_id if isinstance(result, Grant) else None

    def give(permit: str) -> None:
        if local is not None:
            local.release()
        else:
            client.release(permit, Outcome.COMPLETED, 50, 50)

    def loop() -> None:
        grants = denials = peak = errors = 0
        while time.time() < stop_at:
            try:
                permit = take()
            except LimiterError as exc:
                errors += 1
                print(f"acquire failed: {exc!r}", file=sys.stderr)
                continue
            if permit is None:
                denials += 1
                time.sleep(random.uniform(0.001, 0.004))
                continue
            grants += 1
            now_held = int(counter.incr(args.counter_key))
            peak = max(peak, now_held)
            time.sleep(random.uniform(0.02, 0.06))  # the "provider call"
            counter.decr(args.counter_key)
            try:
                give(permit)
            except LimiterError as exc:
                errors += 1
                print(f"release failed: {exc!r}", file=sys.stderr)
        with lock:
            totals["grants"] += grants
            totals["denials"] += denials
            totals["peak"] = max(totals["peak"], peak)
            totals["errors"] += errors

    threads = [threading.Thread(target=loop) for _ in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(totals), flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    p_hold = sub.add_parser("hold")
    p_hold.add_argument("address")
    p_hold.add_argument("pool")
    p_hold.add_argument("--count", type=int, default=1)
    p_hold.add_argument("--lease-ms", type=int, default=1_500)
    p_race = sub.add_parser("race")
    p_race.add_argument("address")
    p_race.add_argument("pool")
    p_race.add_argument("--redis-url", required=True)
    p_race.add_argument("--counter-key", default=f"race:{uuid.uuid4().hex}")
    p_race.add_argument("--threads", type=int, default=30)
    p_race.add_argument("--seconds", type=float, default=3.0)
    p_race.add_argument("--start-at", required=True)
    p_race.add_argument("--local-semaphore", type=int, default=0)
    args = parser.parse_args()
    return hold(args) if args.mode == "hold" else race(args)


if __name__ == "__main__":
    sys.exit(main())
