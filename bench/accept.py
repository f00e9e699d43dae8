"""``fatura bench accept``: open-loop job submissions against the HTTP edge, beside a raw psycopg ceiling.

Requests leave on a schedule computed in advance and each latency counts from its scheduled send
time, so a slow server cannot hide queueing by slowing the sender down (coordinated omission).
The ceiling runs the edge's own accept SQL straight through psycopg, in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import multiprocessing as mp
import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from array import array
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection as MpConnection
from pathlib import Path
from typing import IO, Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from services.acceptance.accept import plan_job, write_params
from services.acceptance.queries import Q as ACCEPT_Q
from services.acceptance.requests import CreateJob, DocumentBody
from services.acceptance.settings import AcceptanceSettings
from services.acceptance.tenants import TenantSpec, create_tenant
from services.common import events
from services.common.db import sync_pool
from services.common.ids import new_id
from services.common.migrate import migrate
from services.common.settings import CommonSettings
from services.sandbox.samples import load_samples

OUT_DIR = Path("out")
JOBS_PATH = "/v1/extraction-jobs"
DEFAULTS = AcceptanceSettings()
# Administrative reads of the bench itself, not application SQL.
NEXT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
SERVER_SETTINGS = (
    "SELECT current_setting(name) FROM unnest(%s::text[]) WITH ORDINALITY AS s(name, n) ORDER BY n"
)
_TICK = os.sysconf("SC_CLK_TCK")
# Limits far above anything a few minutes of load can reach, so admission never refuses.
_UNLIMITED = TenantSpec(
    name="bench-accept",
    max_pending_jobs=2**31 - 1,
    max_pending_bytes=10**15,
    max_pending_tokens=10**15,
    daily_token_budget=10**15,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rates", default="200,300,400,500,600,800,1000,1200,1500", help="offered req/s, comma-separated"
    )
    p.add_argument("--duration", type=float, default=6.0, help="seconds per rate")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds at the lowest rate, not reported")
    p.add_argument("--slo-ms", type=float, default=50.0, help="p99 a rate must stay under to count as held")
    p.add_argument("--generators", type=int, default=1, help="load-generator processes")
    p.add_argument("--connections", type=int, default=64, help="HTTP keep-alive connections in all")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds before a request counts as failed")
    p.add_argument("--http-workers", type=int, default=2, help="uvicorn workers of the edge it starts")
    p.add_argument("--relay", action="store_true", help="also run the outbox relay (to a bench queue prefix)")
    p.add_argument("--url", help="target a running edge (base URL) instead of starting one; needs --api-key")
    p.add_argument("--api-key", help="API key for --url")
    p.add_argument(
        "--database",
        default="fatura_bench",
        help="the bench's own database, dropped and recreated; the ceiling "
        "always runs here (and the edge, unless --url)",
    )
    p.add_argument("--ceiling-connections", type=int, default=8, help="psycopg connections of the ceiling")
    p.add_argument("--ceiling-seconds", type=float, default=6.0, help="0 skips the ceiling")
    p.add_argument(
        "--chart", type=Path, default=OUT_DIR / "bench-accept.png", help="PNG; numbers go beside it"
    )


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class Step:
    """What one generator process sends: its share of one rate's arrival schedule."""

    rate: float
    duration: float
    start_at: float  # time.monotonic(), which is one clock for every process on Linux
    share: int
    shares: int
    tag: str


@dataclass
class Outcome:
    """What came back for one step (from one generator, or merged over all of them)."""

    latencies: array[float] = field(default_factory=lambda: array("d"))  # of 202s, from the schedule
    lags: array[float] = field(default_factory=lambda: array("d"))  # how late each request left
    errors: Counter[str] = field(default_factory=Counter)
    last_done: float = 0.0  # time.monotonic() of the last answer
    elapsed: float = 0.0  # from the first scheduled send to the last answer (at least the duration)

    def merge(self, other: Outcome) -> None:
        self.latencies.extend(other.latencies)
        self.lags.extend(other.lags)
        self.errors.update(other.errors)
        self.last_done = max(self.last_done, other.last_done)


@dataclass(frozen=True)
class RateResult:
    offered: float
    achieved: float
    accepted: int
    errors: dict[str, int]
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    send_lag_p99_ms: float  # large when the generator itself cannot keep to the schedule
    cpu_ms_per_job: dict[str, float]  # client / edge / postgres / other
    busy_percent: float
    write_tx_per_job: float  # transaction ids consumed per accepted job: every commit that flushes WAL

    def held(self, slo_ms: float) -> bool:
        return not self.errors and self.accepted > 0 and self.p99_ms <= slo_ms

    @property
    def disturbed(self) -> bool:
        """Processes outside the bench used a tenth of the machine: the numbers are not clean."""
        return self.cpu_ms_per_job["other"] * self.achieved / 1000 >= 0.1 * (os.cpu_count() or 1)


@dataclass(frozen=True)
class CeilingResult:
    connections: int
    tx_per_second: float
    p50_ms: float
    p99_ms: float
    cpu_ms_per_job: dict[str, float]


def percentile_ms(sorted_seconds: Sequence[float], p: float) -> float:
    """Nearest-rank percentile; NaN for an empty sample."""
    if not sorted_seconds:
        return math.nan
    rank = min(len(sorted_seconds) - 1, max(0, math.ceil(p / 100 * len(sorted_seconds)) - 1))
    return 1000 * sorted_seconds[rank]


# ---------------------------------------------------------------- CPU accounting from /proc


@dataclass(frozen=True)
class CpuSample:
    procs: dict[int, tuple[str, int, float]]  # pid -> (comm, or title of a postgres process; ppid; cpu s)
    busy: float  # machine-wide busy CPU seconds
    at: float


def sample_cpu() -> CpuSample:
    procs: dict[int, tuple[str, int, float]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(entry.path, "stat").read_text()
        except OSError:  # exited while we looked
            continue
        close = raw.rfind(")")
        fields = raw[close + 2 :].split()
        name = raw[raw.find("(") + 1 : close]
        if name == "postgres":  # its title says which database a backend serves
            name = f"pg:{_title(entry.path)}"
        procs[int(entry.name)] = (name, int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICK)
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    busy = (sum(ticks) - ticks[3] - ticks[4]) / _TICK  # all but idle and iowait
    return CpuSample(procs, busy, time.monotonic())


def _title(proc_dir: str) -> str:
    try:
        return Path(proc_dir, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _serves(name: str, database: str) -> bool:
    """A PostgreSQL process of this database, or one every database shares (WAL writer, checkpointer)."""
    if not name.startswith("pg:"):
        return False
    words = name.rsplit(": ", 1)[-1].split()
    if len(words) >= 3 and ("(" in words[2] or words[2] == "[local]"):
        return words[1] == database  # a backend: "user database host(port) state"
    if words[:2] == ["autovacuum", "worker"]:
        return words[2:3] == [database]
    return True


def _descendants(sample: CpuSample, roots: set[int]) -> set[int]:
    found = set(roots)
    grew = True
    while grew:
        more = {pid for pid, (_, ppid, _) in sample.procs.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def cpu_split(
    before: CpuSample, after: CpuSample, *, client: set[int], edge: set[int], database: str
) -> dict[str, float]:
    """CPU seconds spent between two samples by the load generator, the edge, PostgreSQL and the rest.

    PostgreSQL counts the backends of ``database`` and the shared processes; other databases' backends
    (someone else's tests on the same machine) fall under "other".
    """

    def used(pids: set[int]) -> float:
        return sum(after.procs[p][2] - before.procs.get(p, ("", 0, 0.0))[2] for p in pids if p in after.procs)

    edge_pids = _descendants(after, edge) if edge else set()
    pg_pids = {pid for pid, (name, _, _) in after.procs.items() if _serves(name, database)}
    split = {
        "client": used(_descendants(after, client)),
        "edge": used(edge_pids),
        "postgres": used(pg_pids),
    }
    split["other"] = max(0.0, (after.busy - before.busy) - sum(split.values()))
    return split


# ---------------------------------------------------------------- the bench database and the edge


def bench_database(name: str) -> str:
    """Drop and recreate the bench's own database, migrate it, and return its URL."""
    if "bench" not in name:
        raise SystemExit(f"refusing to drop database {name!r}: its name must contain 'bench'")
    base = CommonSettings.from_env().database_url
    with psycopg.connect(make_conninfo(base, dbname="postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    url = make_conninfo(base, dbname=name)
    migrate(url)
    return url


def bench_tenant(database_url: str) -> tuple[uuid.UUID, str]:
    settings = CommonSettings.from_env({"FATURA_DATABASE_URL": database_url})
    with sync_pool(settings, name="bench", max_size=1) as pool:
        return create_tenant(pool, _UNLIMITED)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def stack_process(name: str, env: dict[str, str], log: IO[bytes], ready_url: str) -> Iterator[int]:
    """Run ``fatura run NAME`` as a child until the block ends; yields its pid once it is ready."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "run", name],
        env={**os.environ, **env},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, so its workers go down with it
    )
    try:
        deadline = time.monotonic() + 30
        while not _answers(ready_url):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"`fatura run {name}` did not become ready; see {log.name}")
            time.sleep(0.2)
        yield proc.pid
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def delete_bench_queues(amqp_url: str, prefix: str) -> None:
    """The relay's messages have no consumer in the bench; drop the queues it declared."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        for route in {r for routes in events.ROUTES.values() for r in routes}:
            for suffix in ("", ".DQ", ".XQ"):
                channel.queue_delete(events.queue_name(prefix, route) + suffix)
    finally:
        connection.close()


# ---------------------------------------------------------------- the load generator (child processes)


def job_bodies() -> list[bytes]:
    """Realistic accept requests: one inline sample invoice each, a few hundred bytes."""
    return [
        json.dumps({"document": {"text": s.text, "filename": s.filename}, "priority": "batch"}).encode()
        for s in load_samples()
    ]


def generator_main(
    pipe: MpConnection, url: str, api_key: str, connections: int, timeout: float, slot: Any
) -> None:
    import uvloop

    uvloop.run(_generator_loop(pipe, url, api_key, connections, timeout, slot))


async def _generator_loop(
    pipe: MpConnection, url: str, api_key: str, connections: int, timeout: float, slot: Any
) -> None:
    import aiohttp

    loop = asyncio.get_running_loop()
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    # One session for the whole run keeps connections warm between rates, as a real client would.
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=timeout)) as s:
        while (step := await loop.run_in_executor(None, pipe.recv)) is not None:
            pipe.send(await _send_share(s, url + JOBS_PATH, api_key, step, slot))


async def _send_share(session: Any, url: str, api_key: str, step: Step, slot: Any) -> Outcome:
    import aiohttp

    bodies = job_bodies()
    base = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
    outcome = Outcome()

    async def one(i: int, scheduled: float) -> None:
        headers = {**base, "Idempotency-Key": f"{step.tag}-{i}"}
        outcome.lags.append(time.monotonic() - scheduled)
        try:
            async with session.post(url, data=bodies[i % len(bodies)], headers=headers) as response:
                await response.read()
                status = response.status
        except TimeoutError:
            status = 0
            outcome.errors["timeout"] += 1
        except aiohttp.ClientError as exc:
            status = 0
            outcome.errors[type(exc).__name__] += 1
        done = time.monotonic()
        if status == 202:
            outcome.latencies.append(done - scheduled)
        elif status:
            outcome.errors[str(status)] += 1
        outcome.last_done = max(outcome.last_done, done)
        slot[1] += 1

    tasks: set[asyncio.Task[None]] = set()
    for i in range(step.share, int(step.rate * step.duration), step.shares):
        scheduled = step.start_at + i / step.rate
        # Sleep only when ahead of schedule; when behind, send at once and let the latency show it.
        if (delay := scheduled - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        slot[0] += 1
    while tasks:
        await asyncio.gather(*tasks)
    return outcome


class Generators:
    """Long-lived generator processes, each sending every Nth request of a step's schedule."""

    def __init__(self, count: int, url: str, api_key: str, connections: int, timeout: float) -> None:
        ctx = mp.get_context("spawn")  # the parent runs threads (rich); fork would copy their locks
        self.counters = [ctx.Array("q", 2, lock=False) for _ in range(count)]  # sent, done
        self.pipes: list[MpConnection] = []
        self.procs: list[Any] = []
        for n in range(count):
            ours, theirs = ctx.Pipe()
            args = (theirs, url, api_key, max(1, connections // count), timeout, self.counters[n])
            proc = ctx.Process(target=generator_main, args=args, daemon=True, name=f"bench-gen-{n}")
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs if p.pid is not None}

    def run(self, rate: float, duration: float, tag: str, tick: Callable[[int, int], None]) -> Outcome:
        for counter in self.counters:
            counter[0] = counter[1] = 0
        start_at = time.monotonic() + 0.2  # time for every process to receive the step
        for n, pipe in enumerate(self.pipes):
            pipe.send(Step(rate, duration, start_at, n, len(self.pipes), tag))
        merged = Outcome()
        waiting = set(range(len(self.pipes)))
        while waiting:
            for n in sorted(waiting):
                if self.pipes[n].poll(0.05):
                    merged.merge(self.pipes[n].recv())
                    waiting.discard(n)
                elif not self.procs[n].is_alive():
                    raise RuntimeError(f"load generator {n} exited with code {self.procs[n].exitcode}")
            tick(sum(c[0] for c in self.counters), sum(c[1] for c in self.counters))
        merged.elapsed = max(merged.last_done, start_at + duration) - start_at
        return merged

    def close(self) -> None:
        for pipe in self.pipes:
            pipe.send(None)
        for proc in self.procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()


# ---------------------------------------------------------------- the ceiling: the accept SQL alone


def ceiling_main(
    database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float
) -> tuple[Outcome, dict[str, float]]:
    """Closed loop: each connection runs the edge's accept SQL back to back for ``seconds``.

    CPU is sampled here, while the connections are open: their backends' counters vanish with them.
    """
    text = load_samples()[0].text
    outcome = Outcome(elapsed=seconds)
    started, finished = threading.Barrier(connections + 1), threading.Barrier(connections + 1)
    release = threading.Event()
    failures: list[BaseException] = []

    def worker() -> None:
        mine = array("d")
        try:
            with psycopg.connect(
                database_url, row_factory=dict_row, application_name="fatura-bench", autocommit=True
            ) as conn:
                started.wait()
                end = time.monotonic() + seconds
                while (sent := time.monotonic()) < end:
                    accept_once(conn, tenant_id, text)
                    mine.append(time.monotonic() - sent)
                finished.wait()
                release.wait()
        except BaseException as exc:
            failures.append(exc)
            started.abort()
            finished.abort()
        outcome.latencies.extend(mine)  # array.extend holds the GIL throughout

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(connections)]
    for t in threads:
        t.start()
    try:
        started.wait()
        before = sample_cpu()
        finished.wait()
        database = str(conninfo_to_dict(database_url).get("dbname"))
        cpu = cpu_split(before, sample_cpu(), client={os.getpid()}, edge=set(), database=database)
    except threading.BrokenBarrierError:
        raise failures[0] from None
    finally:
        release.set()
        for t in threads:
            t.join()
    return outcome, cpu


def accept_once(conn: psycopg.Connection[Any], tenant_id: uuid.UUID, text: str) -> None:
    """One job's SQL as the edge sends it far from any limit: the single ``accept_job`` statement.

    The Python around it is left out on purpose (HTTP, parsing, hashing): this is the database's part.
    Near a limit the edge also reads the admission snapshot first; that path is not the steady state.
    """
    key = f"ceiling-{uuid.uuid4()}"
    request = CreateJob(
        document=DocumentBody(text, "ceiling.txt", len(text.encode()), "0" * 64),
        schema="invoice.v1",
        priority="batch",
        deadline_seconds=DEFAULTS.default_deadline_seconds,
        options={},
    )
    plan = plan_job(DEFAULTS, tenant_id, key, request, len(text.encode()), "0" * 64)
    row = conn.execute(
        ACCEPT_Q["accept_job"], write_params(DEFAULTS, tenant_id, key, request, plan, new_id())
    )
    assert row.fetchone() is not None


def run_ceiling(database_url: str, tenant_id: uuid.UUID, connections: int, seconds: float) -> CeilingResult:
    xid_before = next_xid(database_url)
    with mp.get_context("spawn").Pool(1) as pool:
        outcome, cpu = pool.apply(ceiling_main, (database_url, tenant_id, connections, seconds))
    result = summarize(connections, outcome, cpu, next_xid(database_url) - xid_before)
    return CeilingResult(connections, result.achieved, result.p50_ms, result.p99_ms, result.cpu_ms_per_job)


# ---------------------------------------------------------------- orchestration


def next_xid(database_url: str) -> int:
    """The next transaction id: how many WAL-flushing commits the whole cluster has made so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(NEXT_XID).fetchone()
    return int(row[0]) if row else 0


def run_rates(
    gens: Generators, rates: list[float], args: argparse.Namespace, edge_pids: set[int], database_url: str
) -> list[RateResult]:
    tag = uuid.uuid4().hex[:8]
    results: list[RateResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"))
    with Progress(*columns, TimeElapsedColumn(), console=CONSOLE) as progress:
        warm = progress.add_task(f"warm-up {rates[0]:>6.0f}/s", total=rates[0] * args.warmup, note="")
        gens.run(rates[0], args.warmup, f"{tag}-warm", lambda s, d: progress.update(warm, completed=d))
        for rate in rates:
            total = int(rate * args.duration)
            task = progress.add_task(f"offered {rate:>6.0f}/s", total=total, note="")

            def tick(sent: int, done: int, task: Any = task) -> None:
                progress.update(task, completed=done, note=f"sent {sent}, in flight {sent - done}")

            time.sleep(1.0)  # a pause between rates, so one rate's backlog never leaks into the next
            xid_before, cpu_before = next_xid(database_url), sample_cpu()
            outcome = gens.run(rate, args.duration, f"{tag}-{rate:.0f}", tick)
            cpu = cpu_split(
                cpu_before, sample_cpu(), client=gens.pids, edge=edge_pids, database=args.database
            )
            result = summarize(rate, outcome, cpu, next_xid(database_url) - xid_before)
            results.append(result)
            progress.update(task, note=f"p99 {result.p99_ms:.1f} ms, errors {sum(result.errors.values())}")
            if result.p99_ms > 20 * args.slo_ms or result.accepted < 0.5 * total:
                progress.console.print(f"saturated at {rate:.0f}/s; the higher rates are skipped")
                break
    return results


def summarize(rate: float, outcome: Outcome, cpu: dict[str, float], xids: int) -> RateResult:
    ordered = sorted(outcome.latencies)
    accepted = len(ordered)
    elapsed = outcome.elapsed or math.inf
    return RateResult(
        offered=rate,
        achieved=accepted / elapsed,
        accepted=accepted,
        errors=dict(outcome.errors),
        p50_ms=percentile_ms(ordered, 50),
        p95_ms=percentile_ms(ordered, 95),
        p99_ms=percentile_ms(ordered, 99),
        max_ms=percentile_ms(ordered, 100),
        send_lag_p99_ms=percentile_ms(sorted(outcome.lags), 99),
        cpu_ms_per_job={k: 1000 * v / max(1, accepted) for k, v in cpu.items()},
        busy_percent=100 * sum(cpu.values()) / (elapsed * (os.cpu_count() or 1)),
        write_tx_per_job=xids / max(1, accepted),
    )


# ---------------------------------------------------------------- reporting


CONSOLE = Console(width=None if sys.stdout.isatty() else 140)


def print_context(args: argparse.Namespace, database_url: str) -> None:
    names = ["server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        values = dict(zip(names, (row[0] for row in conn.execute(SERVER_SETTINGS, (names,))), strict=True))
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    CONSOLE.print(
        f"[bold]fatura bench accept[/] — {os.cpu_count()} CPUs, load average {load}, "
        f"Python {platform.python_version()}, PostgreSQL {values['server_version']} "
        f"(synchronous_commit={values['synchronous_commit']}, fsync={values['fsync']}, "
        f"shared_buffers={values['shared_buffers']}) on 127.0.0.1"
    )
    target = args.url or f"an edge started here with {args.http_workers} uvicorn workers"
    CONSOLE.print(
        f"target: {target}; outbox relay {'on' if args.relay else 'off'}; {args.generators} generator "
        f"process(es) with {args.connections} connections; {args.duration:g} s per rate after a "
        f"{args.warmup:g} s warm-up"
    )


def print_rates(results: list[RateResult], slo_ms: float, *, remote: bool) -> None:
    table = Table(title="Open-loop POST /v1/extraction-jobs (latency from the scheduled send time)")
    for name in ("offered/s", "achieved/s", "p50 ms", "p95 ms", "p99 ms", "max ms", "errors", "send lag p99"):
        table.add_column(name, justify="right")
    for name in ("CPU ms/job: client", "edge", "postgres", "other", "busy %", "write tx/job"):
        table.add_column(name, justify="right")
    for r in results:
        c = r.cpu_ms_per_job
        cells = [f"{r.offered:.0f}", f"{r.achieved:.0f}", f"{r.p50_ms:.1f}", f"{r.p95_ms:.1f}"]
        cells.append(f"{r.p99_ms:.1f}" if r.p99_ms <= slo_ms else f"[red]{r.p99_ms:.1f}[/]")
        cells.append(f"{r.max_ms:.0f}")
        cells.append(", ".join(f"{k}: {v}" for k, v in sorted(r.errors.items())) or "0")
        cells.append(f"{r.send_lag_p99_ms:.1f}")
        cells.extend(f"{c[k]:.2f}" for k in ("client", "edge", "postgres", "other"))
        cells.extend((f"{r.busy_percent:.0f}", f"{r.write_tx_per_job:.2f}"))
        table.add_row(*cells, style="yellow" if r.disturbed else None)
    CONSOLE.print(table)
    CONSOLE.print(
        "send lag: how far behind its schedule the generator sent (ms). CPU ms/job: CPU time per accepted "
        "job of the load generator, the edge's processes (and the relay's, when on), PostgreSQL (this "
        "database's backends and the shared processes) and everything else; busy %: of all CPUs while the "
        "rate ran; write tx/job: transaction ids used per job (each a commit that waits for a WAL flush)."
    )
    if remote:
        CONSOLE.print(
            "With --url the edge is not a child of the bench: its CPU and its database's fall under 'other'."
        )
    elif any(r.disturbed for r in results):
        CONSOLE.print(
            "[yellow]Yellow rows: processes outside the bench used ≥ 10% of the machine while that rate "
            "ran (CPU column 'other'); rerun for clean numbers.[/]"
        )


def held_rate(results: list[RateResult], slo_ms: float) -> RateResult | None:
    held = [r for r in results if r.held(slo_ms)]
    return max(held, key=lambda r: r.offered) if held else None


def print_verdict(results: list[RateResult], ceiling: CeilingResult | None, slo_ms: float) -> None:
    best = held_rate(results, slo_ms)
    if best is None:
        CONSOLE.print(f"[bold red]No rate was held with p99 ≤ {slo_ms:g} ms and no errors.[/]")
    else:
        CONSOLE.print(
            f"[bold]Highest rate held with p99 ≤ {slo_ms:g} ms and no errors: {best.offered:.0f}/s[/] "
            f"(achieved {best.achieved:.0f}/s, p99 {best.p99_ms:.1f} ms)"
        )
    if ceiling is None:
        return
    c = ceiling.cpu_ms_per_job
    CONSOLE.print(
        f"[bold]Ceiling[/]: the same accept SQL through psycopg, {ceiling.connections} connections, closed "
        f"loop: [bold]{ceiling.tx_per_second:.0f} jobs/s[/] (p50 {ceiling.p50_ms:.1f} ms, p99 "
        f"{ceiling.p99_ms:.1f} ms; CPU ms/job: client {c['client']:.2f}, postgres {c['postgres']:.2f}, "
        f"other {c['other']:.2f})"
    )
    if best is not None:
        CONSOLE.print(f"HTTP held rate / ceiling = [bold]{best.offered / ceiling.tx_per_second:.2f}[/]")


def write_chart(path: Path, results: list[RateResult], ceiling: CeilingResult | None, slo_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    offered = [r.offered for r in results]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(12, 4.8))
    for name, attr in (("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms")):
        lat.plot(offered, [getattr(r, attr) for r in results], marker="o", label=name)
    lat.axhline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    lat.set(xlabel="offered req/s", ylabel="latency from scheduled send (ms)", yscale="log")
    lat.set_title("Latency vs offered rate")
    lat.legend()
    thr.plot(offered, [r.achieved for r in results], marker="o", label="achieved (202/s)")
    thr.plot(offered, offered, color="grey", linestyle=":", label="offered")
    if ceiling is not None:
        thr.axhline(ceiling.tx_per_second, color="green", linestyle="--", label="psycopg ceiling")
    thr.set(xlabel="offered req/s", ylabel="req/s")
    thr.set_title("Achieved vs offered")
    thr.legend()
    best = held_rate(results, slo_ms)
    verdict = f"held {best.offered:.0f}/s" if best else "no rate held"
    ceiling_text = f"; psycopg ceiling {ceiling.tx_per_second:.0f}/s" if ceiling else ""
    fig.suptitle(
        f"fatura bench accept: {verdict} at p99 ≤ {slo_ms:g} ms{ceiling_text}; {os.cpu_count()} CPUs"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- entry point


def run(args: argparse.Namespace) -> int:
    rates = sorted(float(r) for r in args.rates.split(",") if r.strip())
    if not rates or (args.url and not args.api_key):
        CONSOLE.print("give at least one rate, and --api-key with --url")
        return 2
    OUT_DIR.mkdir(exist_ok=True)
    with CONSOLE.status("creating and migrating the bench database"):
        database_url = bench_database(args.database)
        tenant_id, api_key = bench_tenant(database_url)
    print_context(args, database_url)
    with open(OUT_DIR / "bench-accept-stack.log", "wb") as log, _edge(args, database_url, log) as (url, pids):
        gens = Generators(args.generators, url, args.api_key or api_key, args.connections, args.timeout)
        try:
            results = run_rates(gens, rates, args, pids, database_url)
        finally:
            gens.close()
    ceiling = None
    if args.ceiling_seconds > 0:
        with CONSOLE.status(f"ceiling: raw psycopg for {args.ceiling_seconds:g} s"):
            ceiling = run_ceiling(database_url, tenant_id, args.ceiling_connections, args.ceiling_seconds)
    print_rates(results, args.slo_ms, remote=bool(args.url))
    print_verdict(results, ceiling, args.slo_ms)
    write_chart(args.chart, results, ceiling, args.slo_ms)
    raw = {"rates": [asdict(r) for r in results], "ceiling": asdict(ceiling) if ceiling else None}
    args.chart.with_suffix(".json").write_text(json.dumps(raw, indent=2))
    CONSOLE.print(f"chart: {args.chart}  numbers: {args.chart.with_suffix('.json')}")
    return 0


@contextmanager
def _edge(args: argparse.Namespace, database_url: str, log: IO[bytes]) -> Iterator[tuple[str, set[int]]]:
    """The edge under test (and the relay, if asked): started here unless --url names one."""
    if args.url:
        yield args.url.rstrip("/"), set()
        return
    port, prefix = free_port(), "fatura_bench"  # the relay publishes to queues no one else reads
    env = {
        "FATURA_DATABASE_URL": database_url,
        "FATURA_HTTP_HOST": "127.0.0.1",
        "FATURA_HTTP_PORT": str(port),
        "FATURA_HTTP_METRICS_PORT": str(free_port()),
        "FATURA_HTTP_WORKERS": str(args.http_workers),
        "FATURA_MAX_SYSTEM_BACKLOG": str(2**62),
        "FATURA_QUEUE_PREFIX": prefix,
        "FATURA_RELAY_METRICS_PORT": str(free_port()),
        "FATURA_LOG_LEVEL": "WARNING",
    }
    url = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        with CONSOLE.status("starting the edge"):
            pids = {stack.enter_context(stack_process("http", env, log, url + "/readyz"))}
            if args.relay:
                stack.callback(delete_bench_queues, CommonSettings.from_env().amqp_url, prefix)
                relay_ready = f"http://127.0.0.1:{env['FATURA_RELAY_METRICS_PORT']}/readyz"
                pids.add(stack.enter_context(stack_process("relay", env, log, relay_ready)))
        yield url, pids
