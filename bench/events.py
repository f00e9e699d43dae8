"""``fatura bench events``: N concurrent SSE subscribers of one tenant receive every event of M jobs
through the real edge, beside a bare fan-out in the same run.

Edge phase: the bench starts the edge, opens N streams on ``GET /v1/events`` from client processes
(``bench/sse_clients.py``) and measures the edge's memory before and after they opened. Then it
writes M jobs on an open-loop schedule, each through READY (the edge's own accept statement), RUNNING
and SUCCEEDED (the unit of work, as the workers write them), and notes when each commit returned.
An event's lag on a stream is the time from that commit to the read that brought the event to the
subscriber. Every stream must receive every event of the tenant, once, in seq order.

Watch phase (``--watch``, on by default): the same, over gRPC: the ``jobs-grpc`` process, its own
event feed, N ``JobService.Watch`` streams of the tenant from client processes
(``bench/watch_clients.py``), the same writes on the same schedule, the same lag, order and memory.

Ceiling phase: the same writes on the same schedule, but each commit is handed at once to a bare
asyncio server that writes frames of the same size to every one of N connections, batched per 10 ms:
what pushing committed events to N sockets costs on this machine with nothing of the edge in the way
(no database read, no feed tick, no authentication, no watermark, one process). Numbers and a
lag-over-time chart go to ``out/``.
"""

from __future__ import annotations

import argparse
import heapq
import os
import threading
import time
import uuid
from array import array
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import psycopg

from bench import cpu, report
from bench.ceiling import accept_one
from bench.resources import add_database_argument
from bench.sse_clients import BareServer, Clients, Target, rss_bytes
from bench.stack import Stack
from bench.watch_clients import WatchTarget
from bench.watch_clients import client_process as watch_client_process
from services.common import events as event_types
from services.common import states
from services.common.db import SyncPool, sync_pool
from services.common.procs import free_port
from services.common.uow import JobChange, unit_of_work
from services.sandbox.samples import load_samples

STEPS = ((states.READY, None), (states.RUNNING, None), (states.SUCCEEDED, event_types.EXTRACTION_COMPLETED))
STEP_GAP_SECONDS = 0.25
CHANGE = """UPDATE extraction_jobs
            SET state = %(state)s, state_version = state_version + 1, updated_at = now()
            WHERE id = %(job_id)s RETURNING state_version"""
TENANT_EVENTS = """SELECT seq, job_id, state_version FROM job_events WHERE tenant_id = %s ORDER BY seq"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--subscribers", type=int, default=500, help="concurrent SSE streams (default 500)")
    p.add_argument("--jobs", type=int, default=2000, help="jobs, three events each (default 2000)")
    p.add_argument("--rate", type=float, default=50.0, help="jobs started per second (default 50)")
    p.add_argument("--http-workers", type=int, default=2, help="uvicorn workers of the edge (default 2)")
    p.add_argument("--client-processes", type=int, default=2, help="processes holding the streams")
    p.add_argument("--writers", type=int, default=8, help="writer threads (default 8)")
    p.add_argument("--poll", type=float, default=0.0, help="FATURA_EVENT_POLL_SECONDS (default: the edge's)")
    p.add_argument(
        "--watch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the same over gRPC JobService.Watch",
    )
    p.add_argument(
        "--ceiling", action=argparse.BooleanOptionalAction, default=True, help="run the bare fan-out"
    )
    add_database_argument(p, "fatura_bench_events")
    report.add_out_argument(p, "bench-events.png")


@dataclass(frozen=True)
class Phase:
    name: str
    subscribers: int
    events: int
    deliveries: int
    missing: int  # deliveries that never arrived
    out_of_order: int  # streams whose seqs were not the tenant's, in order, once each
    lag_p50_ms: float
    lag_p95_ms: float
    lag_p99_ms: float
    lag_max_ms: float
    lag_p99_ms_by_state: dict[str, float]  # READY and SUCCEEDED wake the edge's feed; RUNNING waits a tick
    # The median over the run's seconds of each second's p99: a stall of the shared machine moves
    # the p99 of the whole run, much less this.
    lag_p99_ms_typical_second: float
    deliveries_per_second: float
    memory_per_subscriber_kib: float  # with the streams open, before any event
    memory_after_events_per_subscriber_kib: float
    server_rss_mib: float
    cpu_seconds: dict[str, float]


# ---------------------------------------------------------------- the writer


class Writer:
    """Writes the jobs on an open-loop schedule from ``threads`` threads; ``committed`` is called
    with (job index, step, job id) right after each commit returns, and notes the time."""

    def __init__(self, pool: SyncPool, tenant_id: uuid.UUID, jobs: int, rate: float, threads: int) -> None:
        self.pool, self.tenant_id, self.jobs, self.rate, self.threads = pool, tenant_id, jobs, rate, threads
        self.text = next(s.text for s in load_samples() if s.expect == states.SUCCEEDED)
        self.job_ids: list[uuid.UUID | None] = [None] * jobs
        self.done = [[threading.Event() for _ in STEPS] for _ in range(jobs)]
        self.commits: dict[tuple[int, int], float] = {}  # (job index, step) -> monotonic
        self.late = array("d")  # how far behind its schedule each write started

    def run(self, committed: Callable[[int, int, uuid.UUID], None]) -> float:
        start = time.monotonic() + 0.5
        heap = [
            (start + i / self.rate + step * STEP_GAP_SECONDS, i, step)
            for i in range(self.jobs)
            for step in (0, 1, 2)
        ]
        heapq.heapify(heap)
        lock = threading.Lock()

        def work() -> None:
            while True:
                with lock:
                    if not heap:
                        return
                    at, i, step = heapq.heappop(heap)
                if (delay := at - time.monotonic()) > 0:
                    time.sleep(delay)
                self.late.append(max(0.0, time.monotonic() - at))
                if step:
                    self.done[i][step - 1].wait()
                job_id = self._write(i, step)
                self.commits[(i, step)] = time.monotonic()
                committed(i, step, job_id)
                self.done[i][step].set()

        threads = [threading.Thread(target=work) for _ in range(self.threads)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return start

    def _write(self, i: int, step: int) -> uuid.UUID:
        if step == 0:
            with self.pool.connection() as conn:
                job_id = accept_one(conn, self.tenant_id, self.text, "interactive")
                conn.execute("NOTIFY fatura_outbox")  # what the edge's notifier sends after an accept
            self.job_ids[i] = job_id
            return job_id
        job_id = self.job_ids[i]
        assert job_id is not None
        state, event_type = STEPS[step]
        with unit_of_work(self.pool) as uow:
            row = uow.execute(CHANGE, {"state": state, "job_id": job_id}).fetchone()
            assert row is not None
            uow.record(JobChange(self.tenant_id, job_id, state, row["state_version"], event_type))
        return job_id


# ---------------------------------------------------------------- measuring

Streams = list[tuple[int, "array[int]", "array[float]"]]


@dataclass
class Run:
    """What one phase measured, before it is summarized."""

    streams: Streams
    expected: list[int]  # the ids every stream must receive, in order
    commit_of: dict[int, float]  # id -> when its commit returned
    step_of: dict[int, int]  # id -> 0 READY, 1 RUNNING, 2 SUCCEEDED
    start: float
    span: float
    rss: tuple[int, int, int]  # the server's memory: before the streams, with them open, at the end
    seconds: dict[str, float]
    # The ids come in no promised order (the bare server's numbers): completeness is checked sorted.
    any_order: bool = False


def _measure(
    name: str,
    target: Target | WatchTarget,
    server_pids: Callable[[], set[int]],
    writer: Writer,
    publish: Callable[[int, int, uuid.UUID], None],
    args: argparse.Namespace,
    database: str,
    server_label: str,
) -> tuple[Streams, float, float, tuple[int, int, int], dict[str, float]]:
    """Open the streams, write the jobs, wait until every stream has every event; returns the
    streams, the schedule's start, the time the last event arrived, the server's memory and CPU."""
    rss_before = rss_bytes(server_pids())
    run = watch_client_process if isinstance(target, WatchTarget) else None
    clients = Clients.start(target, args.subscribers, args.client_processes, run)
    clients.wait_ready(args.subscribers, timeout=120)
    time.sleep(1.0)
    rss_open = rss_bytes(server_pids())
    print(
        f"  {name}: {args.subscribers} streams open; server memory {rss_before / 2**20:.1f} -> "
        f"{rss_open / 2**20:.1f} MiB"
    )
    total = args.subscribers * 3 * args.jobs
    before = cpu.sample()
    started: list[float] = []
    thread = threading.Thread(target=lambda: started.append(writer.run(publish)))
    thread.start()
    deadline = time.monotonic() + 3 * args.jobs / args.rate + 120
    with report.progress(
        f"{name}: events received by all streams", lambda: int(clients.received.value), total, every=5.0
    ):
        while clients.received.value < total and time.monotonic() < deadline:
            time.sleep(0.05)
    last = time.monotonic()
    thread.join()
    after = cpu.sample()
    rss_end = rss_bytes(server_pids())
    streams = clients.collect()
    groups = {server_label: server_pids(), "clients": clients.pids, "writer": {os.getpid()}}
    return (
        streams,
        started[0],
        last,
        (rss_before, rss_open, rss_end),
        cpu.split(before, after, groups, database),
    )


def _per_second(when: np.ndarray, lags: np.ndarray, p: float) -> list[float]:
    """The ``p``th percentile of the lags of the events committed in each second of the run."""
    seconds = np.floor(when).astype(int)
    return [
        float(np.percentile(lags[seconds == b], p, method="inverted_cdf"))
        for b in sorted(set(seconds.tolist()))
    ]


def _summarize(name: str, run: Run) -> tuple[Phase, np.ndarray, np.ndarray]:
    """The phase's figures, and every delivery's (seconds after the start of its commit, lag ms)."""
    commits, received, steps = [], [], []
    for _, seqs, times in run.streams:
        commits.append(
            np.fromiter((run.commit_of.get(s, np.nan) for s in seqs), dtype=float, count=len(seqs))
        )
        steps.append(np.fromiter((run.step_of.get(s, -1) for s in seqs), dtype=int, count=len(seqs)))
        received.append(np.frombuffer(times, dtype=float))
    commit = np.concatenate(commits) if commits else np.array([])
    got = np.concatenate(received) if received else np.array([])
    step = np.concatenate(steps) if steps else np.array([], dtype=int)
    known = ~np.isnan(commit)
    when, lags, step = commit[known] - run.start, (got[known] - commit[known]) * 1000, step[known]

    def q(values: np.ndarray, p: float) -> float:
        return float(np.percentile(values, p, method="inverted_cdf")) if len(values) else float("nan")

    wanted = array("q", run.expected)
    delivered = sum(len(seqs) for _, seqs, _ in run.streams)
    before, opened, end = run.rss
    phase = Phase(
        name=name,
        subscribers=len(run.streams),
        events=len(run.expected),
        deliveries=delivered,
        missing=len(run.streams) * len(run.expected) - delivered,
        out_of_order=sum(
            1
            for status, seqs, _ in run.streams
            if status != 200 or (array("q", sorted(seqs)) if run.any_order else seqs) != wanted
        ),
        lag_p50_ms=q(lags, 50),
        lag_p95_ms=q(lags, 95),
        lag_p99_ms=q(lags, 99),
        lag_max_ms=float(lags.max()) if len(lags) else float("nan"),
        lag_p99_ms_by_state={state: q(lags[step == i], 99) for i, (state, _) in enumerate(STEPS)},
        lag_p99_ms_typical_second=float(np.median(_per_second(when, lags, 99)))
        if len(lags)
        else float("nan"),
        deliveries_per_second=delivered / run.span if run.span > 0 else float("nan"),
        memory_per_subscriber_kib=(opened - before) / max(1, len(run.streams)) / 1024,
        memory_after_events_per_subscriber_kib=(end - before) / max(1, len(run.streams)) / 1024,
        server_rss_mib=end / 2**20,
        cpu_seconds=run.seconds,
    )
    return phase, when, lags


def edge_phase(
    stack: Stack, args: argparse.Namespace, writer_pool: SyncPool
) -> tuple[Phase, np.ndarray, np.ndarray]:
    tenant_id, api_key = stack.make_tenant("bench-events", max_in_flight=100_000)
    env = {"FATURA_EVENT_POLL_SECONDS": str(args.poll)} if args.poll else {}
    edge = stack.start_edge(workers=args.http_workers, **env)
    assert stack.edge_url is not None
    host, port = stack.edge_url.removeprefix("http://").split(":")
    time.sleep(1.0)
    writer = Writer(writer_pool, tenant_id, args.jobs, args.rate, args.writers)
    streams, start, last, rss, seconds = _measure(
        "edge",
        Target(host, int(port), "/v1/events", api_key),
        lambda: cpu.tree(cpu.sample(), {edge.pid}),
        writer,
        lambda i, step, job: None,
        args,
        stack.database,
        "edge",
    )
    stack.stop(edge)
    return _summarize("edge", _tenant_run(stack, tenant_id, writer, streams, start, last, rss, seconds))


def watch_phase(
    stack: Stack, args: argparse.Namespace, writer_pool: SyncPool
) -> tuple[Phase, np.ndarray, np.ndarray]:
    tenant_id, api_key = stack.make_tenant("bench-watch", max_in_flight=100_000)
    env = {"FATURA_EVENT_POLL_SECONDS": str(args.poll)} if args.poll else {}
    port = free_port()
    server = stack.start_metered(
        "jobs-grpc", "FATURA_JOBS_GRPC_METRICS_PORT", FATURA_JOBS_GRPC_PORT=str(port), **env
    ).wait_ready()
    time.sleep(1.0)
    writer = Writer(writer_pool, tenant_id, args.jobs, args.rate, args.writers)
    streams, start, last, rss, seconds = _measure(
        "watch",
        WatchTarget(f"127.0.0.1:{port}", api_key),
        lambda: {server.pid},
        writer,
        lambda i, step, job: None,
        args,
        stack.database,
        "jobs-grpc",
    )
    stack.stop(server)
    return _summarize("watch", _tenant_run(stack, tenant_id, writer, streams, start, last, rss, seconds))


def _tenant_run(
    stack: Stack,
    tenant_id: uuid.UUID,
    writer: Writer,
    streams: Streams,
    start: float,
    last: float,
    rss: tuple[int, int, int],
    seconds: dict[str, float],
) -> Run:
    """What a phase through the real feed measured: every stream must hold the tenant's events."""
    with psycopg.connect(stack.database_url) as conn:
        rows = conn.execute(TENANT_EVENTS, (tenant_id,)).fetchall()
    index = {job: i for i, job in enumerate(writer.job_ids)}
    key = {int(seq): (index[job], version - 1) for seq, job, version in rows}
    return Run(
        streams=streams,
        expected=[int(r[0]) for r in rows],
        commit_of={seq: writer.commits[k] for seq, k in key.items()},
        step_of={seq: k[1] for seq, k in key.items()},
        start=start,
        span=last - start,
        rss=rss,
        seconds=seconds,
    )


def ceiling_phase(
    stack: Stack, args: argparse.Namespace, writer_pool: SyncPool
) -> tuple[Phase, np.ndarray, np.ndarray]:
    tenant_id, _ = stack.make_tenant("bench-events-bare", max_in_flight=100_000)
    server = BareServer()
    try:
        time.sleep(0.5)
        writer = Writer(writer_pool, tenant_id, args.jobs, args.rate, args.writers)
        streams, start, last, rss, seconds = _measure(
            "bare fan-out",
            Target("127.0.0.1", server.port, "/", "-"),
            lambda: {server.pid},
            writer,
            lambda i, step, job: server.publish(3 * i + step + 1),
            args,
            stack.database,
            "bare server",
        )
    finally:
        server.close()
    run = Run(
        streams=streams,
        expected=list(range(1, 3 * args.jobs + 1)),
        commit_of={3 * i + step + 1: t for (i, step), t in writer.commits.items()},
        step_of={3 * i + step + 1: step for (i, step) in writer.commits},
        start=start,
        span=last - start,
        rss=rss,
        seconds=seconds,
        any_order=True,
    )
    return _summarize("bare fan-out", run)


# ---------------------------------------------------------------- report


def _print(phases: list[Phase]) -> None:
    print(
        f"{'phase':<13} {'streams':>7} {'events':>6} {'missing':>7} {'bad streams':>11} {'p50 ms':>7} "
        f"{'p95 ms':>7} {'p99 ms':>7} {'max ms':>7} {'deliveries/s':>12} {'KiB/stream':>10} "
        f"{'after events':>12} {'RSS MiB':>7}"
    )
    for p in phases:
        print(
            f"{p.name:<13} {p.subscribers:>7} {p.events:>6} {p.missing:>7} {p.out_of_order:>11} "
            f"{p.lag_p50_ms:>7.1f} {p.lag_p95_ms:>7.1f} {p.lag_p99_ms:>7.1f} {p.lag_max_ms:>7.0f} "
            f"{p.deliveries_per_second:>12,.0f} {p.memory_per_subscriber_kib:>10.1f} "
            f"{p.memory_after_events_per_subscriber_kib:>12.1f} {p.server_rss_mib:>7.1f}"
        )
    for p in phases:
        by_state = ", ".join(f"{k} {v:.1f}" for k, v in p.lag_p99_ms_by_state.items())
        cpu_text = ", ".join(f"{k} {v:.1f}" for k, v in p.cpu_seconds.items())
        print(f"{p.name}: p99 lag (ms) by event: {by_state}; CPU seconds: {cpu_text}")


def _chart(series: list[tuple[Phase, np.ndarray, np.ndarray]], args: argparse.Namespace) -> Any:
    fig, (lag_ax, mem_ax) = report.pyplot().subplots(
        1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 1]}
    )
    for phase, when, lags in series:
        if not len(lags):
            continue
        buckets = sorted(set(np.floor(when).astype(int).tolist()))
        p99, p50 = _per_second(when, lags, 99), _per_second(when, lags, 50)
        line = lag_ax.plot(buckets, p99, label=f"{phase.name} p99")[0]
        lag_ax.plot(buckets, p50, linestyle=":", color=line.get_color(), label=f"{phase.name} p50")
    lag_ax.set(xlabel="seconds since the first write", ylabel="lag commit -> subscriber (ms)", yscale="log")
    lag_ax.set_title(
        f"Event lag, {args.subscribers} streams, {args.jobs} jobs x 3 events at {args.rate:g} jobs/s"
    )
    lag_ax.legend()
    names = [p.name for p, _, _ in series]
    values = [p.memory_per_subscriber_kib for p, _, _ in series]
    colors = {"edge": "#3b7dd8", "watch": "#e07b39"}
    mem_ax.bar(names, values, color=[colors.get(name, "#999999") for name in names])
    mem_ax.set(ylabel="KiB per open stream")
    mem_ax.set_title("Server memory per stream")
    for x, v in enumerate(values):
        mem_ax.text(x, v, f"{v:.1f}", ha="center", va="bottom")
    fig.suptitle(f"fatura bench events — {report.machine()}")
    return fig


def run(args: argparse.Namespace) -> int:
    report.header(
        "events",
        f"{args.subscribers} SSE streams{' (then as many Watch streams)' if args.watch else ''}, "
        f"{args.jobs} jobs x 3 events at {args.rate:g} jobs/s, edge with {args.http_workers} workers, "
        f"{args.client_processes} client processes",
    )
    with Stack("events", args.database) as stack:
        writer_pool = sync_pool(
            stack.common, name="bench-events-writer", max_size=args.writers, autocommit=True
        )
        writer_pool.open()
        try:
            series = [edge_phase(stack, args, writer_pool)]
            if args.watch:
                series.append(watch_phase(stack, args, writer_pool))
            if args.ceiling:
                series.append(ceiling_phase(stack, args, writer_pool))
        finally:
            writer_pool.close()
    phases = [p for p, _, _ in series]
    _print(phases)
    edge = phases[0]
    verdict = (
        "every stream got every event once, in order"
        if not (edge.missing or edge.out_of_order)
        else (
            f"{edge.missing} deliveries missing, {edge.out_of_order} streams not exactly the tenant's "
            "events in order"
        )
    )
    print(f"edge: {verdict}; load average {report.load_average()} on {os.cpu_count()} CPUs")
    watch = next((p for p in phases if p.name == "watch"), None)
    if watch is not None:
        complete = not (watch.missing or watch.out_of_order)
        print(
            "watch: "
            + (
                "every stream got every event once, in order"
                if complete
                else f"{watch.missing} deliveries missing, {watch.out_of_order} streams not exactly the "
                "tenant's events in order"
            )
            + f"; p99 lag {watch.lag_p99_ms:.1f} ms (edge {edge.lag_p99_ms:.1f} ms), in a typical second "
            f"{watch.lag_p99_ms_typical_second:.1f} ms (edge {edge.lag_p99_ms_typical_second:.1f} ms); "
            f"memory per stream {watch.memory_per_subscriber_kib:.1f} KiB (edge "
            f"{edge.memory_per_subscriber_kib:.1f} KiB)"
        )
    bare = next((p for p in phases if p.name == "bare fan-out"), None)
    if bare is not None:
        print(
            f"p99 lag: edge {edge.lag_p99_ms:.1f} ms, bare fan-out {bare.lag_p99_ms:.1f} ms "
            f"(ceiling / edge = {bare.lag_p99_ms / edge.lag_p99_ms:.2f}); in a typical second: edge "
            f"{edge.lag_p99_ms_typical_second:.1f} ms, bare {bare.lag_p99_ms_typical_second:.1f} ms "
            f"(ceiling / edge = {bare.lag_p99_ms_typical_second / edge.lag_p99_ms_typical_second:.2f}). "
            f"Memory per stream: edge {edge.memory_per_subscriber_kib:.1f} KiB, bare "
            f"{bare.memory_per_subscriber_kib:.1f} KiB"
        )
    numbers = {
        "args": {k: v for k, v in vars(args).items() if k != "out"},
        "phases": [asdict(p) for p in phases],
    }
    numbers["args"]["out"] = str(args.out)
    report.save(args.out, _chart(series, args), numbers)
    return 0 if not any(p.missing or p.out_of_order for p in phases if p.name != "bare fan-out") else 1
