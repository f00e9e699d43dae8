"""``fatura bench fairness``: does one tenant's single job wait behind another tenant's backlog?

Tenant B submits one job through the HTTP edge and waits for it to finish, twenty times, first on
an idle system (the reference), then while tenant A holds a backlog of 5,000 queued jobs that keeps
every execution slot busy (A's jobs are accepted while the workers are stopped, then the workers
start on them). The provider's latency (200 ms, concurrency 16 by default) makes the
backlog real: it takes about a minute to drain, longer than B's twenty tries. Both tenants' jobs
have the same priority (``batch`` unless ``--priority``), so only the fair share among tenants can
put B's job ahead of A's. B's latency is ``finished_at - created_at`` of its job, from the database.
Goal (issue 4): B's p95 under load <= 2x its p95 on the idle system.
"""

from __future__ import annotations

import argparse
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any

from bench import report
from bench.report import load_average, percentile
from bench.stack import TERMINAL, Stack, add_stack_arguments, limiter_toml

GOAL_RATIO = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_stack_arguments(p, "fatura_bench_fairness")
    p.add_argument("--backlog", type=int, default=5000, help="tenant A's queued jobs (default 5000)")
    p.add_argument("--tries", type=int, default=20, help="tenant B's single-job tries per phase (default 20)")
    p.add_argument("--latency-ms", type=float, default=200.0, help="provider latency (default 200)")
    p.add_argument(
        "--distribution", default="fixed", choices=("fixed", "exponential", "lognormal"), help="latency"
    )
    p.add_argument("--concurrency", type=int, default=16, help="provider concurrency = pool max_in_flight")
    p.add_argument("--workers", type=int, default=2, help="inference worker processes (default 2)")
    p.add_argument("--slots", type=int, default=8, help="FATURA_INFERENCE_CONCURRENCY of each worker")
    p.add_argument("--priority", default="batch", choices=("batch", "interactive"), help="of both tenants")
    report.add_out_argument(p, "bench-fairness.png")


@dataclass(frozen=True)
class Phase:
    name: str
    load_average: str
    latencies: list[float]  # seconds, accepted -> terminal, one per try
    states: list[str]
    a_remaining_before: int
    a_remaining_after: int
    p50: float
    p95: float
    max: float


def tries(stack: Stack, name: str, api_key: str, a: uuid.UUID, args: argparse.Namespace) -> Phase:
    load = load_average()
    before = a_remaining(stack, a)
    print(f"{name}: {args.tries} tries of tenant B (load average {load}; A has {before} jobs not finished)")
    latencies, states = [], []
    for i in range(args.tries):
        job = stack.submit_http(api_key, priority=args.priority)
        deadline = time.monotonic() + 120
        while True:
            row = stack.query("job_timing", job_id=job)[0]
            if row["state"] in TERMINAL or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        seconds = float(row["seconds"]) if row["seconds"] is not None else float("nan")
        latencies.append(seconds)
        states.append(str(row["state"]))
        print(f"  try {i + 1:>2}: {row['state']} after {seconds * 1000:7.1f} ms", flush=True)
        time.sleep(0.1)
    after = a_remaining(stack, a)
    p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
    return Phase(name, load, latencies, states, before, after, p50, p95, max(latencies))


def a_remaining(stack: Stack, tenant: uuid.UUID) -> int:
    return sum(n for state, n in stack.tenant_states(tenant).items() if state not in TERMINAL)


def wait_busy(stack: Stack, concurrency: int, timeout: float = 60.0) -> int:
    """Until the provider has (nearly) every permitted call in flight: A's backlog is being worked."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        in_flight = int(stack.provider_stats()["in_flight"])
        if in_flight >= concurrency - 1:
            return in_flight
        time.sleep(0.2)
    return int(stack.provider_stats()["in_flight"])


def run(args: argparse.Namespace) -> int:
    report.header(
        "fairness",
        f"provider latency {args.distribution} {args.latency_ms:g} ms, concurrency {args.concurrency}; "
        f"{args.workers} workers x {args.slots} slots; tenant A backlog {args.backlog}; {args.tries} "
        f"tries; priority {args.priority}",
    )
    with Stack("fairness", args.database, limiter_deadline_ms=args.limiter_deadline_ms) as stack:
        stack.start_limiter(
            limiter_toml(
                rpm=10**8, tpm=10**12, max_in_flight=args.concurrency, tenant_max_in_flight=args.concurrency
            )
        )
        stack.start_provider(
            concurrency=args.concurrency, latency_ms=args.latency_ms, distribution=args.distribution
        )
        stack.start_relay()
        stack.start_scheduler()
        stack.start_edge()
        worker_env = {"FATURA_INFERENCE_CONCURRENCY": str(args.slots)}
        workers = [stack.start_worker(**worker_env) for _ in range(args.workers)]
        a, _ = stack.make_tenant("tenant-a", max_in_flight=args.concurrency)
        _, b_key = stack.make_tenant("tenant-b", max_in_flight=args.concurrency)
        stack.submit_http(b_key, priority=args.priority)  # warms the edge, the relay and the workers
        time.sleep(2.0)
        idle = tries(stack, "idle", b_key, a, args)
        # A's backlog is written while no worker runs (the accept statements would otherwise compete
        # with the claims for two busy cores), then the workers start on it as after a restart.
        for worker in workers:
            stack.stop(worker)
        t0 = time.monotonic()
        stack.accept_jobs(a, args.backlog, priority=args.priority)
        accepted_in = time.monotonic() - t0
        for _ in range(args.workers):
            stack.start_worker(**worker_env)
        busy = wait_busy(stack, args.concurrency)
        print(
            f"tenant A: {args.backlog} jobs accepted in {accepted_in:.1f} s; workers restarted; "
            f"{busy} calls in flight at the provider",
            flush=True,
        )
        loaded = tries(stack, "behind A's backlog", b_key, a, args)
        stats = stack.provider_stats()
        counters = stack.worker_counters()
    print_results(idle, loaded, stats, counters, args)
    return 0


def print_results(
    idle: Phase, loaded: Phase, stats: dict[str, object], counters: dict[str, float], args: argparse.Namespace
) -> None:
    ratio = loaded.p95 / idle.p95
    print()
    for phase in (idle, loaded):
        print(
            f"{phase.name:<20} p50 {phase.p50 * 1000:7.1f} ms   p95 {phase.p95 * 1000:7.1f} ms   "
            f"max {phase.max * 1000:7.1f} ms   ({len(phase.latencies)} tries; A not finished: "
            f"{phase.a_remaining_before} -> {phase.a_remaining_after}; load {phase.load_average})"
        )
    verdict = report.met(ratio <= GOAL_RATIO)
    print(f"B's p95 behind A's backlog / idle p95 = {ratio:.2f}x (goal <= {GOAL_RATIO:g}x: {verdict})")
    drained = loaded.a_remaining_before - loaded.a_remaining_after
    if loaded.a_remaining_after == 0:
        print("warning: A's backlog ran out during the loaded tries; raise --backlog")
    print(
        f"A's jobs finished during B's loaded tries: {drained}; "
        f"provider requests by outcome {stats['by_outcome']}"
    )
    print("workers of the loaded phase counted: " + ", ".join(f"{k} {v:.0f}" for k, v in counters.items()))
    numbers = {
        "idle": asdict(idle),
        "loaded": asdict(loaded),
        "ratio_p95": ratio,
        "worker_counters": counters,
    }
    report.save(args.out, chart(idle, loaded, ratio), numbers)


def chart(idle: Phase, loaded: Phase, ratio: float) -> Any:
    fig, ax = report.pyplot().subplots(figsize=(9, 4.8))
    for phase, color in ((idle, "tab:green"), (loaded, "tab:red")):
        tries_ = range(1, len(phase.latencies) + 1)
        ax.plot(tries_, [x * 1000 for x in phase.latencies], marker="o", color=color, label=phase.name)
        ax.axhline(phase.p95 * 1000, color=color, linestyle=":", label=f"{phase.name} p95")
    ax.axhline(2 * idle.p95 * 1000, color="black", linestyle="--", label="goal: 2x idle p95")
    ax.set(xlabel="try", ylabel="tenant B's job: accepted -> terminal (ms)")
    ax.set_title(f"fatura bench fairness: B's p95 behind A's backlog = {ratio:.2f}x idle")
    ax.legend()
    ax.grid(True, alpha=0.3)
    return fig
