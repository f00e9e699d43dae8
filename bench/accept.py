"""``fatura bench accept``: open-loop job submissions against the HTTP edge, beside a raw psycopg ceiling.

Requests leave on a schedule computed in advance and each latency counts from its scheduled send
time (``bench/load.py``), so a slow server cannot hide queueing by slowing the sender down. Two
ceilings run the edge's own accept SQL straight through psycopg, in the same run (``bench/ceiling.py``):
one statement per transaction, and groups of statements per transaction, pipelined, as the edge's
writers commit them under load (services/acceptance/group_write.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import uuid
from array import array
from dataclasses import asdict, dataclass
from typing import Any

import psycopg
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from bench import cpu, report
from bench.ceiling import SqlCeiling, sql_ceiling
from bench.load import Generators, Outcome, Target
from bench.resources import add_database_argument
from bench.stack import JOBS_PATH, Stack, job_body
from services.sandbox.samples import load_samples

# Administrative reads of the bench itself, not application SQL.
NEXT_XID = "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
SERVER_SETTINGS = (
    "SELECT current_setting(name) FROM unnest(%s::text[]) WITH ORDINALITY AS s(name, n) ORDER BY n"
)
CONSOLE = Console(width=None if sys.stdout.isatty() else 140)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--rates",
        default="200,400,600,800,1000,1200,1500,1800,2000,2200,2500,3000",
        help="offered req/s, comma-separated (a rate far past saturation ends the run)",
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
    add_database_argument(p, "fatura_bench")  # the ceiling always runs here, and the edge unless --url
    p.add_argument("--ceiling-connections", type=int, default=8, help="psycopg connections of the ceiling")
    p.add_argument("--ceiling-seconds", type=float, default=6.0, help="0 skips the ceilings")
    p.add_argument(
        "--ceiling-group",
        type=int,
        default=8,
        help="jobs per transaction of the second ceiling (as the edge's writers group them under load)",
    )
    report.add_out_argument(p, "bench-accept.png", flag="--chart")


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


def summarize(rate: float, outcome: Outcome, seconds: dict[str, float], xids: int) -> RateResult:
    accepted = len(outcome.latencies)
    elapsed = outcome.elapsed or math.inf

    def ms(values: array[float], q: float) -> float:
        return 1000 * report.percentile(values, q)

    return RateResult(
        offered=rate,
        achieved=accepted / elapsed,
        accepted=accepted,
        errors=dict(outcome.errors),
        p50_ms=ms(outcome.latencies, 0.50),
        p95_ms=ms(outcome.latencies, 0.95),
        p99_ms=ms(outcome.latencies, 0.99),
        max_ms=ms(outcome.latencies, 1.0),
        send_lag_p99_ms=ms(outcome.lags, 0.99),
        cpu_ms_per_job={k: 1000 * v / max(1, accepted) for k, v in seconds.items()},
        busy_percent=100 * sum(seconds.values()) / (elapsed * (os.cpu_count() or 1)),
        write_tx_per_job=xids / max(1, accepted),
    )


def next_xid(database_url: str) -> int:
    """The next transaction id: how many WAL-flushing commits the whole cluster has made so far."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(NEXT_XID).fetchone()
    return int(row[0]) if row else 0


def run_rates(
    gens: Generators, rates: list[float], args: argparse.Namespace, edge: set[int], database_url: str
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
            xid_before, cpu_before = next_xid(database_url), cpu.sample()
            outcome = gens.run(rate, args.duration, f"{tag}-{rate:.0f}", tick)
            after = cpu.sample()
            groups = {"client": cpu.tree(after, gens.pids), "edge": cpu.tree(after, edge)}
            seconds = cpu.split(cpu_before, after, groups, args.database)
            result = summarize(rate, outcome, seconds, next_xid(database_url) - xid_before)
            results.append(result)
            progress.update(task, note=f"p99 {result.p99_ms:.1f} ms, errors {sum(result.errors.values())}")
            missed = [r for r in results[-2:] if not r.held(args.slo_ms)]
            if result.p99_ms > 20 * args.slo_ms or result.accepted < 0.5 * total or len(missed) == 2:
                progress.console.print(f"saturated at {rate:.0f}/s; the higher rates are skipped")
                break
    return results


def print_context(args: argparse.Namespace, database_url: str) -> None:
    names = ["server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections"]
    with psycopg.connect(database_url, autocommit=True) as conn:
        values = dict(zip(names, (row[0] for row in conn.execute(SERVER_SETTINGS, (names,))), strict=True))
    CONSOLE.print(
        f"[bold]fatura bench accept[/] — {report.machine()}, Python {platform.python_version()}, PostgreSQL "
        f"{values['server_version']} (synchronous_commit={values['synchronous_commit']}, "
        f"fsync={values['fsync']}, shared_buffers={values['shared_buffers']}) on 127.0.0.1"
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


def print_verdict(results: list[RateResult], ceilings: list[SqlCeiling], slo_ms: float) -> None:
    best = held_rate(results, slo_ms)
    if best is None:
        CONSOLE.print(f"[bold red]No rate was held with p99 ≤ {slo_ms:g} ms and no errors.[/]")
    else:
        CONSOLE.print(
            f"[bold]Highest rate held with p99 ≤ {slo_ms:g} ms and no errors: {best.offered:.0f}/s[/] "
            f"(achieved {best.achieved:.0f}/s, p99 {best.p99_ms:.1f} ms)"
        )
    for ceiling in ceilings:
        c = ceiling.cpu_ms_per_job
        how = (
            "one statement per transaction"
            if ceiling.group == 1
            else f"{ceiling.group} statements per transaction, pipelined (as the edge groups them under load)"
        )
        CONSOLE.print(
            f"[bold]Ceiling[/]: the same accept SQL through psycopg, {how}, {ceiling.connections} "
            f"connections, closed loop: [bold]{ceiling.tx_per_second:.0f} jobs/s[/] "
            f"(p50 {ceiling.p50_ms:.1f} ms, p99 {ceiling.p99_ms:.1f} ms; CPU ms/job: client "
            f"{c['client']:.2f}, postgres {c['postgres']:.2f}, other {c['other']:.2f})"
        )
        if best is not None:
            CONSOLE.print(
                f"HTTP held rate / ceiling ({ceiling.group} per transaction) = "
                f"[bold]{best.offered / ceiling.tx_per_second:.2f}[/]"
            )


def chart(results: list[RateResult], ceilings: list[SqlCeiling], slo_ms: float) -> Any:
    offered = [r.offered for r in results]
    fig, (lat, thr) = report.pyplot().subplots(1, 2, figsize=(12, 4.8))
    for name, attr in (("p50", "p50_ms"), ("p95", "p95_ms"), ("p99", "p99_ms")):
        lat.plot(offered, [getattr(r, attr) for r in results], marker="o", label=name)
    lat.axhline(slo_ms, color="red", linestyle="--", label=f"SLO {slo_ms:g} ms")
    lat.set(xlabel="offered req/s", ylabel="latency from scheduled send (ms)", yscale="log")
    lat.set_title("Latency vs offered rate")
    lat.legend()
    thr.plot(offered, [r.achieved for r in results], marker="o", label="achieved (202 answers/s)")
    thr.plot(offered, offered, color="grey", linestyle=":", label="offered")
    for ceiling, style in zip(ceilings, ("--", "-."), strict=False):
        label = "psycopg ceiling" + (f", {ceiling.group} per transaction" if ceiling.group > 1 else "")
        thr.axhline(ceiling.tx_per_second, color="green", linestyle=style, label=label)
    thr.set(xlabel="offered req/s", ylabel="req/s")
    thr.set_title("Achieved vs offered")
    thr.legend()
    best = held_rate(results, slo_ms)
    verdict = f"held {best.offered:.0f}/s" if best else "no rate held"
    ceiling_text = "".join(f"; psycopg ceiling ({c.group}/tx) {c.tx_per_second:.0f}/s" for c in ceilings)
    fig.suptitle(
        f"fatura bench accept: {verdict} at p99 ≤ {slo_ms:g} ms{ceiling_text}; {os.cpu_count()} CPUs"
    )
    return fig


def run(args: argparse.Namespace) -> int:
    rates = sorted(float(r) for r in args.rates.split(",") if r.strip())
    if not rates or (args.url and not args.api_key):
        CONSOLE.print("give at least one rate, and --api-key with --url")
        return 2
    with CONSOLE.status("creating and migrating the bench database"):
        stack = Stack("accept", args.database)
    with stack:
        tenant_id, api_key = stack.make_tenant("bench-accept", max_in_flight=100_000)
        print_context(args, stack.database_url)
        if args.url is None:
            with CONSOLE.status("starting the edge"):
                stack.start_edge(workers=args.http_workers)
                if args.relay:  # it publishes to the run's own queues, deleted at the end
                    stack.start_relay()
        url = args.url.rstrip("/") if args.url else str(stack.edge_url)
        bodies = [json.dumps(job_body(sample, "batch")).encode() for sample in load_samples()]
        headers = {"Authorization": f"Bearer {args.api_key or api_key}", "Content-Type": "application/json"}
        target = Target(f"{url}{JOBS_PATH}", headers, bodies)
        gens = Generators(args.generators, target, args.connections, args.timeout)
        try:
            results = run_rates(gens, rates, args, {p.pid for p in stack.procs}, stack.database_url)
        finally:
            gens.close()
        stack.stop_all()  # the ceiling runs on a quiet database
        ceilings: list[SqlCeiling] = []
        for group in sorted({1, args.ceiling_group}) if args.ceiling_seconds > 0 else ():
            with CONSOLE.status(
                f"ceiling: raw psycopg, {group} per transaction, for {args.ceiling_seconds:g} s"
            ):
                ceilings.append(
                    sql_ceiling(
                        stack.database_url, tenant_id, args.ceiling_connections, args.ceiling_seconds, group
                    )
                )
    print_rates(results, args.slo_ms, remote=bool(args.url))
    print_verdict(results, ceilings, args.slo_ms)
    numbers = {
        "rates": [asdict(r) for r in results],
        "ceiling": asdict(ceilings[0]) if ceilings else None,
        "ceilings": [asdict(c) for c in ceilings],
    }
    report.save(args.chart, chart(results, ceilings, args.slo_ms), numbers)
    return 0
