"""``fatura chaos run|list``: the SRE's fault-injection command (see ``services.chaos``)."""

from __future__ import annotations

import argparse
import logging
import signal
from pathlib import Path
from typing import Any

from services.cli.extras import require

SMOKE_JOBS = 20
DEFAULT_JOBS = 120


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "chaos", help="fault-injection runs of the whole stack, one fault family at a time"
    )
    chaos = parser.add_subparsers(dest="chaos_command", required=True, metavar="COMMAND")
    run = chaos.add_parser(
        "run",
        help="run scenarios on private stacks and check the invariants",
        description="Each scenario starts a stack of its own (database, queue prefix, Redis keys, ports) "
        "behind fault proxies, submits a burst of sample invoices, injects one fault, waits for the "
        "backlog to drain and checks the invariants. Exit status 1 when any invariant failed.",
    )
    run.add_argument(
        "--scenario",
        default="all",
        help="a scenario name, several separated by commas, 'all' (default) or 'smoke' (fatura chaos list)",
    )
    run.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=f"sample invoices per burst (default {DEFAULT_JOBS}; {SMOKE_JOBS} for smoke)",
    )
    run.add_argument("--report", default="out/chaos", help="directory of the JSON report, timelines and logs")
    run.set_defaults(func=_run)
    listing = chaos.add_parser("list", help="the scenarios and what each does")
    listing.set_defaults(func=_list)


def _list(args: argparse.Namespace) -> int:
    from services.chaos.scenarios import SCENARIOS, SMOKE

    for scenario in SCENARIOS:
        smoke = " (smoke)" if scenario.name in SMOKE else ""
        print(f"{scenario.name:30} {scenario.family:10} {scenario.description}{smoke}")
    return 0


def _run(args: argparse.Namespace) -> int:
    # The live view, the timeline charts and the reference ERP each scenario's stack starts.
    require("fatura chaos run", "bench")
    from rich.console import Console

    from services.chaos.runner import Runner
    from services.chaos.scenarios import select
    from services.chaos.settings import ChaosSettings
    from services.cli.stack import check_dependencies

    # The run's own chatter (migrations of each scenario's database, font caches) is not the report.
    for name in ("services.common.migrate", "matplotlib"):
        logging.getLogger(name).setLevel(logging.WARNING)
    console = Console() if Console().is_terminal else Console(width=160)
    try:
        scenarios = select(args.scenario)
    except ValueError as exc:
        console.print(f"[red]fatura chaos run:[/red] {exc}")
        return 2
    jobs = args.jobs if args.jobs is not None else SMOKE_JOBS if args.scenario == "smoke" else DEFAULT_JOBS
    if jobs < 1:
        console.print("[red]fatura chaos run:[/red] --jobs must be at least 1")
        return 2
    settings = ChaosSettings.from_env()
    problems = check_dependencies(settings.common)
    if problems:
        for line in problems:
            console.print(f"[red]fatura chaos run:[/red] {line}")
        return 1
    console.print(
        f"fatura chaos run: {len(scenarios)} scenario(s), {jobs} jobs per burst, report in {args.report}"
    )
    # SIGTERM stops a run the way Ctrl-C does: the current scenario's processes, database, queues
    # and keys are removed on the way out.
    signal.signal(signal.SIGTERM, _interrupt)
    return Runner(settings, jobs, Path(args.report), console).run(scenarios)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
