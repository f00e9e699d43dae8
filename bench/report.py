"""How every benchmark reports: the line it starts with (the machine and its load), progress while it
runs, percentiles, the verdict against its goal, and a chart written with its numbers beside it
(``out/NAME.png`` and ``out/NAME.json``)."""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
import timeit
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

OUT_DIR = Path("out")


def add_out_argument(p: argparse.ArgumentParser, name: str, *, flag: str = "--out") -> None:
    p.add_argument(flag, type=Path, default=OUT_DIR / name, help="the chart (PNG); its numbers go beside it")


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    return f"{os.cpu_count()} CPUs, load average {load_average()}"


def interpreter_us() -> float:
    """Microseconds per ``sum(range(100))``, best of five, as ``python -m timeit`` reports it: how
    fast this machine runs Python right now. CPU per job moves with it from day to day on a shared
    machine; a bench prints it beside its CPU figures so runs on different days can be compared."""
    timer = timeit.Timer("sum(range(100))")
    number, _ = timer.autorange()
    return 1e6 * min(timer.repeat(repeat=5, number=number)) / number


def header(name: str, details: str) -> None:
    """The first line of a run: which bench, on how many CPUs under what load, and its settings."""
    print(f"fatura bench {name} — {machine()}; {details}", flush=True)


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest rank: the smallest value with at least ``q`` (0 to 1) of them at or below it; NaN for none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = math.ceil(q * len(ordered) - 1e-9)  # the tolerance keeps 0.95 * 20 at 19
    return ordered[min(len(ordered), max(1, rank)) - 1]


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


@contextmanager
def progress(
    label: str, done: Callable[[], int], total: int | None = None, *, every: float = 1.0
) -> Iterator[None]:
    """Print how far ``label`` has come every ``every`` seconds while the block runs, and at its end."""
    started, stop = time.monotonic(), threading.Event()

    def line() -> None:
        count, seconds = done(), time.monotonic() - started
        of = f"/{total:,}" if total is not None else ""
        rate = count / seconds if seconds > 0 else 0.0
        print(f"  {label}: {count:,}{of} after {seconds:5.1f} s ({rate:,.0f}/s)", flush=True)

    def tick() -> None:
        while not stop.wait(every):
            line()

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        line()


def pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(out: Path, fig: Any, numbers: Mapping[str, Any]) -> None:
    """Write the numbers (``out`` with ``.json``) and the chart (``out``), and say where they are."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(numbers, indent=2) + "\n", encoding="utf-8")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    pyplot().close(fig)
    print(f"chart: {out}  numbers: {out.with_suffix('.json')}", flush=True)
