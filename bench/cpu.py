"""Where the CPU of a benchmark run went, from ``/proc`` samples taken before and after: groups of
the bench's own processes, PostgreSQL (this database's backends and the shared processes), RabbitMQ
and Redis when asked, and everything else on the machine (other engineers' tests on a shared box)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")
# Servers shared with everything else on the machine, found by their command name.
SERVERS = {"rabbitmq": "beam.smp", "redis": "redis-server"}


@dataclass(frozen=True)
class CpuSample:
    procs: dict[int, tuple[str, int, float]]  # pid -> (comm, or title of a postgres process; ppid; cpu s)
    busy: float  # machine-wide busy CPU seconds (not counting steal)
    at: float
    # Machine-wide CPU seconds the hypervisor gave to other guests while ours were ready to run: no
    # process here used them, so they are not "other" work, and a bench shows them apart.
    steal: float = 0.0


def sample() -> CpuSample:
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
    busy, steal = busy_and_steal(Path("/proc/stat").read_text().split("\n", 1)[0])
    return CpuSample(procs, busy, time.monotonic(), steal)


def busy_and_steal(cpu_line: str) -> tuple[float, float]:
    """Busy and stolen CPU seconds from the ``cpu`` line of ``/proc/stat``: user nice system idle
    iowait irq softirq steal guest guest_nice, in ticks. Busy is all but idle, iowait and steal;
    guest time is already counted in user and nice, so it is not added again."""
    ticks = [int(x) for x in cpu_line.split()[1:]]
    busy = sum(ticks[:3]) + sum(ticks[5:7])
    steal = ticks[7] if len(ticks) > 7 else 0
    return busy / _TICK, steal / _TICK


def stolen(before: CpuSample, after: CpuSample) -> float:
    """Seconds of steal between the samples, every CPU together."""
    return max(0.0, after.steal - before.steal)


def _title(proc_dir: str) -> str:
    try:
        return Path(proc_dir, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_seconds(pid: int) -> float:
    """User + system CPU seconds one process has spent so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def tree(sample: CpuSample, roots: set[int]) -> set[int]:
    """The roots and every process descended from them."""
    found = set(roots)
    grew = True
    while grew:
        more = {pid for pid, (_, ppid, _) in sample.procs.items() if ppid in found} - found
        found |= more
        grew = bool(more)
    return found


def serves(name: str, database: str) -> bool:
    """A PostgreSQL process of this database, or one every database shares (WAL writer, checkpointer)."""
    if not name.startswith("pg:"):
        return False
    words = name.rsplit(": ", 1)[-1].split()
    if len(words) >= 3 and ("(" in words[2] or words[2] == "[local]"):
        return words[1] == database  # a backend: "user database host(port) state"
    if words[:2] == ["autovacuum", "worker"]:
        return words[2:3] == [database]
    return True


def split(
    before: CpuSample,
    after: CpuSample,
    groups: Mapping[str, set[int]],
    database: str,
    *,
    servers: bool = False,
) -> dict[str, float]:
    """CPU seconds between two samples: each group's processes, then RabbitMQ and Redis (with
    ``servers``), ``postgres`` and ``other``, the rest of the machine's busy time.

    PostgreSQL counts the backends of ``database`` and the shared processes; other databases' backends
    (someone else's tests on the same machine) fall under "other".
    """

    def used(pids: set[int]) -> float:
        return sum(after.procs[p][2] - before.procs.get(p, ("", 0, 0.0))[2] for p in pids if p in after.procs)

    def named(test: str) -> set[int]:
        return {pid for pid, (name, _, _) in after.procs.items() if name == test}

    seconds = {label: used(pids) for label, pids in groups.items()}
    if servers:
        seconds.update({label: used(named(comm)) for label, comm in SERVERS.items()})
    seconds["postgres"] = used({pid for pid, (name, _, _) in after.procs.items() if serves(name, database)})
    seconds["other"] = max(0.0, (after.busy - before.busy) - sum(seconds.values()))
    return seconds
