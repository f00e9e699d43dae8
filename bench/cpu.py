"""Where the CPU of a benchmark run went: each of the stack's processes (by name), PostgreSQL (this
database's backends and the shared processes), the bench process itself, and everything else on the
machine (other engineers' tests on a shared box), from ``/proc`` samples taken before and after."""

from __future__ import annotations

import os

from bench.accept import CpuSample, _descendants, _serves, sample_cpu
from bench.stack import Stack

__all__ = ["CpuSample", "sample_cpu", "split"]


def split(stack: Stack, before: CpuSample, after: CpuSample, database: str) -> dict[str, float]:
    """CPU seconds between the samples by the stack's process name, ``postgres``, ``rabbitmq``,
    ``redis``, ``bench`` (the accepting threads) and ``other``."""

    def used(pids: set[int]) -> float:
        return sum(after.procs[p][2] - before.procs.get(p, ("", 0, 0.0))[2] for p in pids if p in after.procs)

    seconds: dict[str, float] = {}
    for proc in stack.procs:
        seconds[proc.name] = seconds.get(proc.name, 0.0) + used(_descendants(after, {proc.popen.pid}))
    seconds["bench"] = used({os.getpid()})
    # Shared with everything else on the machine, but the pipeline is most of their work during a run.
    for label, comm in (("rabbitmq", "beam.smp"), ("redis", "redis-server")):
        seconds[label] = used({pid for pid, (name, _, _) in after.procs.items() if name == comm})
    seconds["postgres"] = used({pid for pid, (name, _, _) in after.procs.items() if _serves(name, database)})
    seconds["other"] = max(0.0, (after.busy - before.busy) - sum(seconds.values()))
    return seconds
