"""The load the benchmarks offer.

Open loop: requests leave on a schedule computed in advance and each latency counts from its
scheduled time, so a slow server cannot hide its queue by slowing the sender down (coordinated
omission). Closed loop: threads that each send the next request when the last one is answered.
``Generators``: processes that POST on an open-loop schedule over HTTP (``bench/http_client.py`` on
uvloop).
Every time here is ``time.monotonic()``, one clock for every process on Linux.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing as mp
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable, Coroutine
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as MpConnection
from typing import Any, TypeVar

from httptools import HttpParserError

from bench.http_client import HttpClient, request_prefix

S = TypeVar("S")


async def open_loop(
    rate: float,
    duration: float,
    send: Callable[[int, float], Coroutine[Any, Any, None]],
    *,
    start_at: float | None = None,
    share: int = 0,
    shares: int = 1,
) -> None:
    """Start ``send(i, scheduled)`` at ``start_at + i / rate`` for every ``shares``-th request from
    ``share`` on, whether or not earlier ones have finished; return when all have."""
    start_at = time.monotonic() if start_at is None else start_at
    tasks: set[asyncio.Task[None]] = set()
    for i in range(share, int(rate * duration), shares):
        scheduled = start_at + i / rate
        # Sleep only when ahead of schedule; when behind, send at once and let the latency show it.
        if (delay := scheduled - time.monotonic()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(send(i, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    while tasks:
        await asyncio.gather(*tasks)


def threaded_open_loop(
    rate: float,
    duration: float,
    threads: int,
    call: Callable[[float], Any],
    *,
    failures: tuple[type[BaseException], ...] = (),
    start_at: float | None = None,
) -> Calls:
    """Blocking ``call(scheduled)`` at ``start_at + i / rate`` for i < rate x duration, each scheduled
    start on thread ``i % threads`` (which sleeps until then, or starts at once when behind); every
    start kept is the scheduled one, so a slow answer still counts from its schedule.

    For a blocking client that worker threads call directly (no event loop hands the call to a
    thread): at most ``threads`` calls are in flight, and a call that outlives ``threads / rate``
    seconds delays its thread's next start, which the latency from the schedule then shows.
    """
    calls, lock = Calls(), threading.Lock()
    total = int(rate * duration)
    first = (time.monotonic() + 0.05) if start_at is None else start_at
    errors: list[BaseException] = []

    def worker(share: int) -> None:
        kept = Calls()
        try:
            for i in range(share, total, threads):
                scheduled = first + i / rate
                if (delay := scheduled - time.monotonic()) > 0:
                    time.sleep(delay)
                try:
                    value = call(scheduled)
                except failures as exc:
                    kept.failures.append(repr(exc))
                    continue
                kept.starts.append(scheduled)
                kept.ends.append(time.monotonic())
                kept.values.append(value)
        except BaseException as exc:
            errors.append(exc)
        with lock:
            calls.starts.extend(kept.starts)
            calls.ends.extend(kept.ends)
            calls.values.extend(kept.values)
            calls.failures.extend(kept.failures)

    pool = [threading.Thread(target=worker, args=(share,), daemon=True) for share in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    calls.seconds = time.monotonic() - first
    if errors:
        raise errors[0]
    return calls


# ---------------------------------------------------------------- closed loop, one session per thread


class Exhausted(Exception):
    """Raised by a closed loop's call when no work is left: its thread stops."""


@dataclass
class Calls:
    """What a closed loop kept: each measured call's start and end, what it returned, and failures."""

    starts: array[float] = field(default_factory=lambda: array("d"))
    ends: array[float] = field(default_factory=lambda: array("d"))
    values: list[Any] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0  # from the end of the warm-up until every thread had stopped

    def latencies(self) -> list[float]:
        return [end - start for start, end in zip(self.starts, self.ends, strict=True)]


def closed_loop(
    threads: int,
    session: Callable[[], AbstractContextManager[S]],
    call: Callable[[S], Any],
    *,
    seconds: float = math.inf,
    warmup: float = 0.0,
    failures: tuple[type[BaseException], ...] = (),
    window: Callable[[], AbstractContextManager[Any]] = nullcontext,
) -> Calls:
    """``threads`` threads, each with its own ``session()``, run ``call(session)`` back to back for
    ``warmup + seconds`` or until a call raises ``Exhausted``; calls started in the warm-up are not kept.

    The clock starts once every session is open. ``window()`` is entered when the measured time begins
    and left when every thread has stopped, while the sessions are still open (a PostgreSQL backend's
    CPU counters vanish with its connection). An exception in ``failures`` is kept and the thread
    goes on; any other ends the run.
    """
    calls, lock, release = Calls(), threading.Lock(), threading.Event()
    clock: list[float] = []  # the measured window's start and end, set once every session is open
    errors: list[BaseException] = []
    ready = threading.Barrier(threads + 1, action=lambda: clock.extend(_window(warmup, seconds)))
    finished = threading.Barrier(threads + 1)

    def worker() -> None:
        kept = Calls()
        try:
            with session() as own:
                ready.wait()
                start_at, stop_at = clock
                while (t0 := time.monotonic()) < stop_at:
                    try:
                        value = call(own)
                    except Exhausted:
                        break
                    except failures as exc:
                        if t0 >= start_at:
                            kept.failures.append(repr(exc))
                        continue
                    if t0 >= start_at:
                        end = time.monotonic()
                        kept.starts.append(t0)
                        kept.ends.append(end)
                        kept.values.append(value)
                finished.wait()
                release.wait()
        except BaseException as exc:
            errors.append(exc)
            ready.abort()
            finished.abort()
        with lock:  # each thread's calls are merged once, at its end
            calls.starts.extend(kept.starts)
            calls.ends.extend(kept.ends)
            calls.values.extend(kept.values)
            calls.failures.extend(kept.failures)

    pool = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for thread in pool:
        thread.start()
    try:
        ready.wait()
        time.sleep(max(0.0, clock[0] - time.monotonic()))
        with window():
            finished.wait()
            calls.seconds = time.monotonic() - clock[0]
    except threading.BrokenBarrierError:
        pass  # a thread failed; its exception is raised below
    finally:
        release.set()
        for thread in pool:
            thread.join()
    if errors:
        raise errors[0]
    return calls


def _window(warmup: float, seconds: float) -> tuple[float, float]:
    start = time.monotonic() + warmup
    return start, start + seconds


# ---------------------------------------------------------------- HTTP generator processes


@dataclass(frozen=True)
class Target:
    """What the generators POST: one URL, fixed headers and bodies taken in turn; each request has its
    own ``Idempotency-Key``, and ``ok`` is the status that counts as an answer."""

    url: str
    headers: dict[str, str]
    bodies: list[bytes]
    ok: int = 202


@dataclass(frozen=True)
class Step:
    """What one generator process sends: its share of one rate's arrival schedule."""

    rate: float
    duration: float
    start_at: float
    share: int
    shares: int
    tag: str


@dataclass
class Outcome:
    """What came back for one step (from one generator, or merged over all of them)."""

    latencies: array[float] = field(default_factory=lambda: array("d"))  # of ``ok`` answers
    lags: array[float] = field(default_factory=lambda: array("d"))  # how late each request left
    errors: Counter[str] = field(default_factory=Counter)
    last_done: float = 0.0  # when the last answer came
    elapsed: float = 0.0  # from the first scheduled send to the last answer (at least the duration)

    def merge(self, other: Outcome) -> None:
        self.latencies.extend(other.latencies)
        self.lags.extend(other.lags)
        self.errors.update(other.errors)
        self.last_done = max(self.last_done, other.last_done)


def generator_main(pipe: MpConnection, target: Target, connections: int, timeout: float, slot: Any) -> None:
    import uvloop

    uvloop.run(_generator_loop(pipe, target, connections, timeout, slot))


async def _generator_loop(
    pipe: MpConnection, target: Target, connections: int, timeout: float, slot: Any
) -> None:
    loop = asyncio.get_running_loop()
    host, port, prefix = request_prefix(target.url, target.headers)
    # One client for the whole run keeps connections warm between rates, as a real client would.
    client = HttpClient(host, port, limit=connections)
    try:
        await client.connect_all()
        while (step := await loop.run_in_executor(None, pipe.recv)) is not None:
            pipe.send(await _send_share(client, prefix, target, step, timeout, slot))
    finally:
        client.close()


async def _send_share(
    client: HttpClient, prefix: bytes, target: Target, step: Step, timeout: float, slot: Any
) -> Outcome:
    outcome = Outcome()
    tag = step.tag

    async def one(i: int, scheduled: float) -> None:
        slot[0] += 1
        outcome.lags.append(time.monotonic() - scheduled)
        try:
            async with asyncio.timeout(timeout):
                status = await client.request(
                    prefix, f"Idempotency-Key: {tag}-{i}\r\n".encode(), target.bodies[i % len(target.bodies)]
                )
        except TimeoutError:
            status = 0
            outcome.errors["timeout"] += 1
        except (OSError, HttpParserError) as exc:
            status = 0
            outcome.errors[type(exc).__name__] += 1
        done = time.monotonic()
        if status == target.ok:
            outcome.latencies.append(done - scheduled)
        elif status:
            outcome.errors[str(status)] += 1
        outcome.last_done = max(outcome.last_done, done)
        slot[1] += 1

    await open_loop(
        step.rate, step.duration, one, start_at=step.start_at, share=step.share, shares=step.shares
    )
    return outcome


class Generators:
    """Long-lived generator processes, each sending every Nth request of a step's schedule. ``main``
    is what each process runs: ``generator_main`` (HTTP POSTs of a ``Target``) unless another sender
    is given (``bench/grpc_load.py``), with its own target."""

    def __init__(
        self,
        count: int,
        target: Any,
        connections: int,
        timeout: float,
        main: Callable[..., None] = generator_main,
    ) -> None:
        ctx = mp.get_context("spawn")  # the parent runs threads (rich); fork would copy their locks
        self.counters = [ctx.Array("q", 2, lock=False) for _ in range(count)]  # sent, done
        self.pipes: list[MpConnection] = []
        self.procs: list[Any] = []
        for n in range(count):
            ours, theirs = ctx.Pipe()
            args = (theirs, target, max(1, connections // count), timeout, self.counters[n])
            proc = ctx.Process(target=main, args=args, daemon=True, name=f"bench-gen-{n}")
            proc.start()
            self.pipes.append(ours)
            self.procs.append(proc)

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs if p.pid is not None}

    def run(self, rate: float, duration: float, tag: str, tick: Callable[[int, int], None]) -> Outcome:
        """Send one rate for ``duration`` over every process; ``tick(sent, done)`` while it runs."""
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
