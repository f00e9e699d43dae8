"""``fatura bench pipeline``: jobs/s from accepted to SUCCEEDED through the whole inference pipeline,
beside a no-op Dramatiq actor's rate on the same RabbitMQ in the same run (the ceiling).

The simulated provider answers with zero latency and no limits, and the limiter's pool is far above
anything reachable, so what is measured is the pipeline's own overhead: the relay publishing the
requested event, ``ingest`` writing the inbox and sending a wake-up, a slot's fair claim with its
limiter permit, the provider call, validation, the fenced completion, and the relay publishing the
completed event. Jobs are accepted with the edge's own ``accept_job`` statement (not HTTP: the edge
is measured by ``fatura bench accept``), as fast as four connections go, while everything runs; the
figure is the job count over the time from the first acceptance to the last terminal state, both
read from the database. Several worker layouts (processes x execution slots) run one after the
other on the same stack, each with a tenant of its own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import cpu, report
from bench.ceiling import in_child
from bench.report import OUT_DIR, load_average, percentile
from bench.stack import Stack, add_stack_arguments, limiter_toml, noop_queue
from services.common.settings import CommonSettings
from services.inference.settings import InferenceSettings

GOAL_JOBS_PER_SECOND = 300.0
GOAL_CPU_MS_PER_JOB = 6.5  # every process on the machine, per job
GOAL_TRANSACTIONS_PER_JOB = 3.0
# Stand-ins the bench brings that a deployment does not run: the simulated model provider, and the
# bench's own process, which writes the backlog in the edge's place.
STAND_INS = ("provider", "bench")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_stack_arguments(p, "fatura_bench_pipeline")
    p.add_argument("--jobs", type=int, default=3000, help="jobs per layout (default 3000)")
    p.add_argument(
        "--layouts",
        default="1x8,1x16,2x8,2x16",
        help="worker layouts to try, PROCESSESxCONCURRENCY, comma-separated (default 1x8,1x16,2x8,2x16)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=InferenceSettings.threads,
        help=f"FATURA_INFERENCE_THREADS of each worker (default {InferenceSettings.threads}, the service's)",
    )
    p.add_argument(
        "--suppliers",
        type=int,
        default=0,
        help="master suppliers each tenant has besides the samples' (default 0)",
    )
    p.add_argument(
        "--accept-group",
        type=int,
        default=8,
        help="jobs per acceptance transaction, pipelined, as the edge's writers commit a burst "
        "(default 8; 1: one transaction per job, as before)",
    )
    p.add_argument("--noop-messages", type=int, default=6000, help="messages for the no-op actor ceiling")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a layout may take before giving up")
    p.add_argument(
        "--profile",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="record each worker with py-spy for this many seconds of each layout (folded stacks in out/)",
    )
    report.add_out_argument(p, "bench-pipeline.png")


@dataclass(frozen=True)
class LayoutResult:
    layout: str
    processes: int
    concurrency: int
    jobs: int
    finished: int
    by_state: dict[str, int]
    seconds: float
    jobs_per_second: float
    steady_jobs_per_second: float  # between the 10th and the 90th percentile of finish times
    p50_seconds: float  # accepted -> terminal, per job
    p99_seconds: float
    load_average: str
    cpu_ms_per_job: dict[str, float]  # by process name, postgres, bench (the accepting), other
    # CPU the hypervisor gave to other guests during the run (not counted above), ms per job.
    steal_ms_per_job: float
    # µs per sum(range(100)) before and after the layout ran (report.interpreter_us): the machine's
    # speed for Python at the time, which CPU per job follows.
    interpreter_us: tuple[float, float]
    transactions_per_job: float  # PostgreSQL commits and rollbacks in the bench database
    # Shared buffers PostgreSQL's statements touched in the bench database: how much it worked, in a
    # unit the machine's speed does not change (so a change to a statement shows on a noisy machine).
    blocks_per_job: float
    worker_counters: dict[str, float]  # deferrals, limiter calls past the deadline, claims, hops
    # Seconds from the last terminal state until the worker's ingest had taken in every job (the
    # CPU and transaction counts run until then, so work left queued behind the jobs is counted).
    ingest_lag_seconds: float
    finish_offsets: list[float]  # seconds after the first acceptance, for the chart


@dataclass(frozen=True)
class Ceiling:
    messages: int
    threads: int
    publish_per_second: float
    consume_per_second: float


# ---------------------------------------------------------------- the no-op ceiling (child process)


def noop_main(amqp_url: str, queue: str, count: int, threads: int) -> tuple[float, float]:
    """Publish ``count`` messages, then consume them with a no-op actor; returns both durations.

    The broker is ``make_broker`` and the consumer ``run_worker``, exactly as the inference worker
    builds them (confirms on, quorum queue, prefetch = threads).
    """
    import dramatiq

    from services.common.broker import make_broker
    from services.common.worker import run_worker

    broker = make_broker(CommonSettings.from_env({**os.environ, "FATURA_AMQP_URL": amqp_url}))
    done = threading.Event()
    seen = [0]
    lock = threading.Lock()

    def noop() -> None:
        with lock:
            seen[0] += 1
            if seen[0] >= count:
                done.set()

    actor = dramatiq.actor(actor_name="noop", queue_name=queue, broker=broker, max_retries=0)(noop)
    broker.declare_queue(queue, ensure=True)
    t0 = time.perf_counter()
    for _ in range(count):
        actor.send()
    published = time.perf_counter() - t0
    consumed: list[float] = []
    stop = threading.Event()

    def watch() -> None:
        done.wait()
        consumed.append(time.perf_counter() - t1)
        stop.set()

    t1 = time.perf_counter()
    threading.Thread(target=watch, daemon=True).start()
    run_worker(
        broker,
        name="bench no-op",
        queues=[queue],
        threads=threads,
        metrics_port=0,
        ready=lambda: None,
        stop=stop,
    )
    return published, consumed[0]


def measure_ceiling(stack: Stack, count: int, threads: int) -> Ceiling:
    print(
        f"ceiling: {count} messages to a no-op actor ({threads} threads, prefetch {threads}) ...", flush=True
    )
    published, consumed = in_child(noop_main, stack.common.amqp_url, noop_queue(stack.prefix), count, threads)
    ceiling = Ceiling(count, threads, count / published, count / consumed)
    print(
        f"ceiling: published {ceiling.publish_per_second:,.0f} msg/s (confirms on), "
        f"consumed {ceiling.consume_per_second:,.0f} msg/s by the no-op actor",
        flush=True,
    )
    return ceiling


# ---------------------------------------------------------------- one layout


def run_layout(stack: Stack, layout: str, args: argparse.Namespace) -> LayoutResult:
    processes, concurrency = (int(x) for x in layout.lower().split("x"))
    env = {"FATURA_INFERENCE_CONCURRENCY": str(concurrency), "FATURA_INFERENCE_THREADS": str(args.threads)}
    workers = [stack.start_worker(**env) for _ in range(processes)]
    try:
        # A few jobs first, so connections, imports and caches are warm before the clock starts.
        warm, _ = stack.make_tenant("warm", max_in_flight=100_000, extra_suppliers=args.suppliers)
        stack.accept_jobs(warm, 50)
        wait_terminal(stack, warm, 50, 60.0, quiet=True)
        tenant, _ = stack.make_tenant(f"pipe-{layout}", max_in_flight=100_000, extra_suppliers=args.suppliers)
        load = load_average()
        master = f"; {args.suppliers:,} master suppliers more than the samples'" if args.suppliers else ""
        print(
            f"layout {layout}: {processes} worker(s) x {concurrency} slots{master}; load average {load}",
            flush=True,
        )
        profilers = start_profilers(workers, layout, args.profile) if args.profile > 0 else []
        speed_before = report.interpreter_us()
        cpu_before, db_before = cpu.sample(), database_work(stack)
        # Accept from a thread, so progress counts from the first acceptance.
        accepted = _Tally()
        accepting = threading.Thread(
            target=stack.accept_jobs,
            args=(tenant, args.jobs),
            kwargs={"group": args.accept_group, "on_accepted": accepted.add},
            daemon=True,
        )
        accepting.start()
        wait_terminal(stack, tenant, args.jobs, args.timeout, quiet=False, accepted=accepted.read)
        accepting.join()
        ingest_lag = wait_ingested(stack, tenant, args.jobs, args.timeout)
        cpu_after = cpu.sample()
        seconds = stack.cpu_seconds(cpu_before, cpu_after)
        steal = cpu.stolen(cpu_before, cpu_after)
        time.sleep(1.0)  # PostgreSQL publishes its counters at most once a second
        db_work = database_work(stack) - db_before
        counters = stack.worker_counters()
        for profiler in profilers:
            finish_profiler(profiler, args.profile + 30)
    finally:
        for worker in workers:
            stack.stop(worker)
    speed = (round(speed_before, 3), round(report.interpreter_us(), 3))
    result = summarize(stack, tenant, layout, processes, concurrency, load, seconds, db_work, counters)
    finished = max(1, result.finished)
    return replace(
        result,
        ingest_lag_seconds=ingest_lag,
        steal_ms_per_job=round(1000 * steal / finished, 3),
        interpreter_us=speed,
    )


def finish_profiler(profiler: subprocess.Popen[bytes], timeout: float) -> None:
    """py-spy stops by itself after its duration; one that hangs is interrupted (it writes on SIGINT)."""
    try:
        profiler.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        profiler.send_signal(signal.SIGINT)
        try:
            profiler.wait(timeout=10)
        except subprocess.TimeoutExpired:
            profiler.kill()
            profiler.wait()


@dataclass(frozen=True)
class DatabaseWork:
    """pg_stat_database's counters of the bench database (see bench.sql, transactions)."""

    transactions: int
    blocks: int

    def __sub__(self, other: DatabaseWork) -> DatabaseWork:
        return DatabaseWork(self.transactions - other.transactions, self.blocks - other.blocks)


def database_work(stack: Stack) -> DatabaseWork:
    row = stack.query("transactions")[0]
    return DatabaseWork(int(row["xacts"]), int(row["blocks"]))


class _Tally:
    """How many jobs the accepting thread has committed so far."""

    def __init__(self) -> None:
        self._n = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self._n += n

    def read(self) -> int:
        with self._lock:
            return self._n


def wait_terminal(
    stack: Stack,
    tenant: uuid.UUID,
    total: int,
    timeout: float,
    *,
    quiet: bool,
    accepted: Callable[[], int] | None = None,
) -> None:
    """Until ``total`` jobs of ``tenant`` are terminal, printing progress. The jobs accepted so far
    (``accepted``; all ``total`` when not given) less the tenant's pending count is how many
    ended: read before the pending count, so a job accepted in between is counted as not ended
    (and the difference, never below 0, can only lag)."""
    started = last_print = time.monotonic()
    while True:
        so_far = accepted() if accepted else total
        done = max(0, so_far - stack.tenant_pending(tenant))
        now = time.monotonic()
        if not quiet and (now - last_print >= 2.0 or done >= total):
            rate = done / (now - started)
            print(
                f"  {done:>6}/{total} terminal after {now - started:5.1f} s ({rate:6.1f} jobs/s so far)",
                flush=True,
            )
            last_print = now
        if done >= total:
            return
        if now - started > timeout:
            print(f"  gave up after {timeout:g} s: {dict(stack.tenant_states(tenant))}", flush=True)
            return
        time.sleep(0.5)


def wait_ingested(stack: Stack, tenant: uuid.UUID, total: int, timeout: float) -> float:
    """Wait until the ingest has taken every job of ``tenant`` into the execution inbox (the jobs
    may all have run before: a slot claims from the database, not from the message). Returns how
    many seconds that took."""
    started = time.monotonic()
    while True:
        taken = int(stack.query("tenant_ingested", tenant_id=tenant)[0]["n"])
        waited = time.monotonic() - started
        if taken >= total:
            if waited >= 0.5:
                print(f"  ingest took in the last of {total} jobs {waited:.1f} s later", flush=True)
            return waited
        if waited > timeout:
            print(f"  gave up waiting for the ingest after {timeout:g} s: {taken}/{total}", flush=True)
            return waited
        time.sleep(0.25)


def start_profilers(workers: list[Any], layout: str, seconds: float) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    made = []
    for worker in workers:
        out = OUT_DIR / f"bench-pipeline-{layout}-{worker.pid}.folded"
        command = [spy, "record", "--pid", str(worker.pid), "--duration", str(int(seconds))]
        # --gil: only samples holding the GIL, so the profile shows where Python spends CPU, not waits.
        command += ["--format", "raw", "--rate", "200", "--gil", "--nonblocking", "--output", str(out)]
        made.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT))
        print(f"  py-spy recording worker {worker.pid} for {seconds:g} s into {out}", flush=True)
    return made


def summarize(
    stack: Stack,
    tenant: uuid.UUID,
    layout: str,
    processes: int,
    concurrency: int,
    load: str,
    cpu_seconds: dict[str, float],
    db_work: DatabaseWork,
    counters: dict[str, float],
) -> LayoutResult:
    span = stack.query("tenant_span", tenant_id=tenant)[0]
    rows = stack.query("tenant_finish_times", tenant_id=tenant)
    first = float(span["first_accepted"])
    finishes = [float(r["finished"]) - first for r in rows]
    latencies = [float(r["finished"]) - float(r["accepted"]) for r in rows]
    seconds = float(span["seconds"] or 0.0)
    finished = int(span["finished"])
    lo, hi = int(0.1 * len(finishes)), int(0.9 * len(finishes)) - 1
    steady = (hi - lo) / (finishes[hi] - finishes[lo]) if hi > lo and finishes[hi] > finishes[lo] else 0.0
    return LayoutResult(
        layout=layout,
        processes=processes,
        concurrency=concurrency,
        jobs=int(span["jobs"]),
        finished=finished,
        by_state=dict(stack.tenant_states(tenant)),
        seconds=seconds,
        jobs_per_second=finished / seconds if seconds else 0.0,
        steady_jobs_per_second=steady,
        p50_seconds=percentile(latencies, 0.50),
        p99_seconds=percentile(latencies, 0.99),
        load_average=load,
        cpu_ms_per_job={k: round(1000 * v / max(1, finished), 3) for k, v in cpu_seconds.items()},
        transactions_per_job=db_work.transactions / max(1, finished),
        blocks_per_job=db_work.blocks / max(1, finished),
        worker_counters=counters,
        ingest_lag_seconds=0.0,
        finish_offsets=finishes,
        steal_ms_per_job=0.0,
        interpreter_us=(0.0, 0.0),
    )


# ---------------------------------------------------------------- entry point


def run(args: argparse.Namespace) -> int:
    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    report.header(
        "pipeline",
        f"{args.jobs} jobs per layout, accepted {args.accept_group} per transaction, zero-latency "
        "simulated provider with no limits, limiter pool limits far above reach",
    )
    with Stack("pipeline", args.database, limiter_deadline_ms=args.limiter_deadline_ms) as stack:
        stack.start_limiter(
            limiter_toml(rpm=10**8, tpm=10**12, max_in_flight=100_000, tenant_max_in_flight=100_000)
        )
        stack.start_provider()
        stack.start_relay()
        stack.start_scheduler()
        ceiling = measure_ceiling(stack, args.noop_messages, args.threads)
        results = [run_layout(stack, layout, args) for layout in layouts]
    print_results(results, ceiling, args.out, args.accept_group)
    return 0


def print_results(results: list[LayoutResult], ceiling: Ceiling, out: Path, accept_group: int) -> None:
    print()
    print(
        f"{'layout':<8} {'jobs':>6} {'seconds':>8} {'jobs/s':>8} {'steady/s':>9} "
        f"{'p50 s':>7} {'p99 s':>7}  states"
    )
    for r in results:
        states = ", ".join(f"{k} {v}" for k, v in sorted(r.by_state.items()))
        print(
            f"{r.layout:<8} {r.finished:>6} {r.seconds:>8.1f} {r.jobs_per_second:>8.1f} "
            f"{r.steady_jobs_per_second:>9.1f} {r.p50_seconds:>7.2f} {r.p99_seconds:>7.2f}  {states}"
            f"   (load {r.load_average})"
        )
    print("CPU ms per job (all cores), and PostgreSQL transactions per job:")
    for r in results:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in sorted(r.cpu_ms_per_job.items(), key=lambda kv: -kv[1]))
        print(
            f"  {r.layout:<8} {parts}; {r.transactions_per_job:.1f} transactions/job, "
            f"{r.blocks_per_job:,.0f} shared blocks/job "
            f"(counted until the ingest took in every job, {r.ingest_lag_seconds:.1f} s after the last ended)"
        )
        print(
            f"  {'':<8} not counted: steal {r.steal_ms_per_job:.2f} ms per job (CPU the hypervisor gave "
            f"to other guests); machine speed sum(range(100)) {r.interpreter_us[0]:.3f} µs before, "
            f"{r.interpreter_us[1]:.3f} µs after"
        )
    print(
        "worker counters (deferrals, limiter calls past their deadline, claims, hops, wake-ups,"
        " relay nudges, inbox group commit):"
    )
    for r in results:
        print(f"  {r.layout:<8} " + ", ".join(f"{k} {v:.0f}" for k, v in r.worker_counters.items()))
    best = max(results, key=lambda r: r.jobs_per_second)
    ratio = best.jobs_per_second / ceiling.consume_per_second
    print(
        f"best: {best.layout} at {best.jobs_per_second:.1f} jobs/s accepted -> terminal; goal >= "
        f"{GOAL_JOBS_PER_SECOND:g} jobs/s: {report.met(best.jobs_per_second >= GOAL_JOBS_PER_SECOND)}"
    )
    cpu_all = sum(best.cpu_ms_per_job.values())
    cpu_own = cpu_all - sum(best.cpu_ms_per_job.get(k, 0.0) for k in STAND_INS)
    few_transactions = best.transactions_per_job <= GOAL_TRANSACTIONS_PER_JOB
    print(
        f"CPU per job at {best.layout}: {cpu_all:.2f} ms in all; goal <= {GOAL_CPU_MS_PER_JOB:g} ms: "
        f"{report.met(cpu_all <= GOAL_CPU_MS_PER_JOB)} ({cpu_own:.2f} ms without the simulated provider "
        f"and the bench's own process); {best.transactions_per_job:.1f} PostgreSQL transactions per job; "
        f"goal <= {GOAL_TRANSACTIONS_PER_JOB:g}: {report.met(few_transactions)}"
    )
    print(
        f"ceiling: no-op Dramatiq actor {ceiling.consume_per_second:,.0f} msg/s "
        f"({ceiling.threads} threads, same broker settings); "
        f"best / ceiling = {ratio:.3f} (a job: its event's share of an ingest message, which carries up "
        f"to FATURA_RELAY_EVENTS_PER_MESSAGE events, and a run wake-up if no slot was free)"
    )
    numbers = {
        "accept_group": accept_group,
        "ceiling": asdict(ceiling),
        "layouts": [asdict(r) | {"finish_offsets": None} for r in results],
    }
    report.save(out, chart(results, ceiling), numbers)


def chart(results: list[LayoutResult], ceiling: Ceiling) -> Any:
    fig, (curve, bars) = report.pyplot().subplots(1, 2, figsize=(12, 4.8))
    for r in results:
        curve.plot(
            r.finish_offsets,
            range(1, len(r.finish_offsets) + 1),
            label=f"{r.layout} ({r.jobs_per_second:.0f}/s)",
        )
    curve.set(xlabel="seconds after the first acceptance", ylabel="jobs terminal")
    curve.set_title("Jobs finished over time, per layout (processes x slots)")
    curve.legend()
    curve.grid(True, alpha=0.3)
    names = [r.layout for r in results] + ["no-op actor"]
    values = [r.jobs_per_second for r in results] + [ceiling.consume_per_second]
    bars.bar(names, values, color=["tab:blue"] * len(results) + ["tab:green"])
    bars.axhline(
        GOAL_JOBS_PER_SECOND, color="red", linestyle="--", label=f"goal {GOAL_JOBS_PER_SECOND:g} jobs/s"
    )
    bars.set(ylabel="jobs/s (no-op: messages/s)", yscale="log")
    bars.set_title("Pipeline jobs/s vs the no-op Dramatiq ceiling")
    bars.legend()
    fig.suptitle(f"fatura bench pipeline: {os.cpu_count()} CPUs, zero-latency provider, no limits")
    return fig
