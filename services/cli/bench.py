"""``fatura bench NAME``: benchmarks from ``bench/``.

Each prints a figure beside a ceiling measured in the same run.

A benchmark module exposes ``add_arguments(parser)`` and ``run(args) -> int``; it is imported only
when asked for, so the rest of the CLI does not pay for its imports.
"""

from __future__ import annotations

import argparse
import importlib
import signal
from typing import Any

from services.cli.extras import require
from services.cli.stack import apply_local_defaults

BENCHMARKS = {
    "accept": ("bench.accept", "open-loop job submissions against the running HTTP edge vs raw psycopg"),
    "jobs-grpc": ("bench.jobs_grpc", "open-loop gRPC JobService Submit beside HTTP accept, in the same run"),
    "limiter": ("bench.limiter", "Acquire+Release pairs through the limiter vs the raw Lua scripts"),
    "delivery": ("bench.delivery", "signed webhook deliveries/s to the local ERP vs raw httpx POSTs"),
    "gateway": ("bench.gateway", "provider gateway overhead per call vs a bare httpx call to the simulator"),
    "pipeline": ("bench.pipeline", "jobs/s accepted -> SUCCEEDED, zero-latency provider, vs a no-op actor"),
    "quota": ("bench.quota", "attempts/s against a rate-limited provider vs seed 000's capacity formula"),
    "events": ("bench.events", "SSE subscribers receiving every event of a tenant's jobs vs a bare fan-out"),
    "fairness": ("bench.fairness", "one tenant's job latency behind another's 5,000-job backlog vs idle"),
    "kv": (
        "bench.kv",
        "short and very long invoices on a simulated vLLM: request-count vs KV-token admission",
    ),
}


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "bench",
        help="run a benchmark from bench/ (fatura bench NAME --help for its options)",
        description="; ".join(f"{name}: {text}" for name, (_, text) in BENCHMARKS.items()),
    )
    parser.add_argument("benchmark", choices=sorted(BENCHMARKS))
    parser.add_argument("options", nargs=argparse.REMAINDER, help="options of the benchmark")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    require(f"fatura bench {args.benchmark}", "bench")
    # A benchmark starts processes of a local stack, with the local stack's settings.
    apply_local_defaults()
    module_name, text = BENCHMARKS[args.benchmark]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(prog=f"fatura bench {args.benchmark}", description=text)
    module.add_arguments(parser)
    # Stopped by SIGTERM (kill, timeout), a benchmark unwinds as on Ctrl-C: its stack stops the
    # processes it started and deletes its queues and keys, instead of leaving them running.
    signal.signal(signal.SIGTERM, _interrupt)
    return int(module.run(parser.parse_args(args.options)) or 0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
