"""``fatura up``: every process of the local stack in the foreground, supervised: a child that
exits is restarted with backoff; Ctrl-C or SIGTERM stops all it started."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from services.cli.processes import PROCESSES
from services.cli.stack import (
    RestartPolicy,
    Stack,
    apply_erp_ack_default,
    apply_local_defaults,
    check_dependencies,
)
from services.common.migrate import migrate
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "up",
        help="run the whole local stack in the foreground, restarting a child that exits (Ctrl-C stops it)",
        description="Checks PostgreSQL, RabbitMQ and Redis, applies migrations, then runs and supervises: "
        + "; ".join(p.description for p in PROCESSES),
    )
    parser.add_argument(
        "--only", default=None, help="comma-separated process names to run (default: all of them)"
    )
    parser.set_defaults(func=_up)


def _up(args: argparse.Namespace) -> int:
    names = None
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = set(names) - {p.name for p in PROCESSES}
        if unknown:
            print(f"fatura up: unknown process names {sorted(unknown)}", file=sys.stderr)
            return 2
    for spec in PROCESSES:
        if names is None or spec.name in names:
            spec.require(f"fatura up (for {spec.name}; --only can leave it out)")
    apply_local_defaults()
    apply_erp_ack_default()
    settings = CommonSettings.from_env()
    policy = RestartPolicy.from_env()
    problems = check_dependencies(settings)
    if problems:
        for line in problems:
            print(f"fatura up: {line}", file=sys.stderr)
        return 1
    for m in migrate(settings.database_url):
        print(f"fatura up: applied migration {m.version:04d}_{m.name}")
    stack = Stack(names, policy=policy)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stack.start()
    started = ", ".join(f"{key} (pid {stack.pid(key)})" for key in stack.keys)
    print(f"fatura up: started {started}; a child that exits is restarted; Ctrl-C stops them", flush=True)
    stop.wait()
    print("fatura up: stopping", flush=True)
    stack.stop()
    restarts = len(stack.restarts)
    print(f"fatura up: stopped ({restarts} restart{'s' if restarts != 1 else ''} while running)", flush=True)
    return 0
