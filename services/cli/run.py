"""``fatura run NAME``: run one process of the stack in the foreground."""

from __future__ import annotations

import argparse
from typing import Any

from services.cli.processes import OPTIONAL_PROCESSES, PROCESSES, by_name
from services.common import tracing
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "run",
        help="run one process of the stack in the foreground",
        description="Run one process of the stack: "
        + "; ".join(f"{p.name} ({p.description})" for p in (*PROCESSES, *OPTIONAL_PROCESSES)),
    )
    parser.add_argument("name", choices=[p.name for p in (*PROCESSES, *OPTIONAL_PROCESSES)])
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    tracing.setup(args.name, trace_file=CommonSettings.from_env().trace_file)
    try:
        return int(by_name(args.name).load()() or 0)
    finally:
        tracing.shutdown()
