"""``fatura bench limiter``: Acquire+Release pairs through the limiter, beside the same Lua scripts
called straight through redis-py, in the same run.

Closed loop: N concurrent clients (default 32), each doing Acquire then Release as fast as answers
come back: first the scripts through redis-py (the ceiling), then the limiter through a grpc.aio
client (one RPC per call), then through grpc.aio with one ``Batch`` RPC per pair (a slot's Release
with its next Acquire), then through the blocking ``LimiterClient`` with one thread per client (as
workers use it; its threads' calls share Batch RPCs).
Reported: pairs/s, p50/p99 of each RPC and of the pair, and the CPU each process spent per pair
(bench, limiter server, the whole Redis server) to show where time goes.
Open loop (``--open-rates``): pairs start on a fixed schedule and latency counts from the
scheduled start, so a slow server cannot hide its queue (no coordinated omission); each rate runs
through the same three limiter paths.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from bench import cpu, load, report, resources
from bench.procs import Proc, spawn
from bench.report import percentile
from services.common.procs import free_port

POOL_TOML = """
[pools.{pool}]
rpm = 1000000000
tpm = 1000000000000
max_in_flight = 1000000
"""
GOAL_PAIRS_PER_S = 3_000
GOAL_RATIO = 0.8  # of the raw redis-py ceiling in the same run: either this or GOAL_PAIRS_PER_S
GOAL_P99_MS = 5.0  # pair p99 ...
GOAL_OPEN_RATE = 1_000.0  # ... in the open loop at this rate
# The threads the open loop calls LimiterClient from (as the worker's slots do): more than the pairs
# ever in flight at GOAL_OPEN_RATE.
OPEN_LOOP_THREADS = 64


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", help="bench this running limiter (its config must have --pool)")
    p.add_argument("--pool", default="bench", help="pool name (default: bench, limits nothing reaches)")
    p.add_argument("--clients", type=int, default=32, help="concurrent clients, closed loop (default 32)")
    p.add_argument("--duration", type=float, default=8.0, help="measured seconds per closed-loop phase")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each phase")
    p.add_argument(
        "--open-rates", default="500,1000,2000", help="open-loop pairs/s, comma-separated ('' skips)"
    )
    p.add_argument("--open-duration", type=float, default=5.0, help="measured seconds per open-loop rate")
    p.add_argument(
        "--no-threads-phase", dest="threads_phase", action="store_false", help="skip LimiterClient"
    )
    p.add_argument("--redis-url", help="Redis for the limiter and the ceiling (default FATURA_REDIS_URL)")
    report.add_out_argument(p, "bench_limiter.png")


@dataclass
class Phase:
    name: str
    pairs: int = 0
    errors: int = 0
    elapsed: float = 0.0
    acquire_ms: list[float] = field(default_factory=list)
    release_ms: list[float] = field(default_factory=list)
    pair_ms: list[float] = field(default_factory=list)
    cpu_s: dict[str, float] = field(default_factory=dict)  # process -> CPU seconds in the phase
    error_samples: list[str] = field(default_factory=list)
    offered: float | None = None  # open loop: scheduled pairs/s

    def record(self, t0: float, t1: float, t2: float) -> None:
        """One pair: Acquire sent at t0 (or scheduled for t0), answered at t1, Release answered at t2."""
        self.pairs += 1
        self.acquire_ms.append((t1 - t0) * 1000)
        self.release_ms.append((t2 - t1) * 1000)
        self.pair_ms.append((t2 - t0) * 1000)

    def record_batch(self, t0: float, t1: float) -> None:
        """One pair as one Batch RPC sent (or scheduled) at t0 and answered at t1: the Release and
        the Acquire got their answers together."""
        self.record(t0, t1, t1)
        self.release_ms[-1] = self.acquire_ms[-1]

    def fail(self, description: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(description)

    @property
    def rate(self) -> float:
        return self.pairs / self.elapsed if self.elapsed else 0.0

    def figures(self) -> dict[str, Any]:
        """The numbers written beside the chart."""
        spread = {
            f"{what}_p{round(100 * q)}_ms": percentile(getattr(self, f"{what}_ms"), q)
            for what in ("acquire", "release", "pair")
            for q in (0.5, 0.99)
        }
        cpu_us = (
            {who: seconds / self.pairs * 1e6 for who, seconds in self.cpu_s.items()} if self.pairs else {}
        )
        head = {"name": self.name, "offered": self.offered, "pairs_per_second": self.rate}
        return {**head, "pairs": self.pairs, "errors": self.errors, **spread, "cpu_us_per_pair": cpu_us}


class CpuMeter:
    """CPU seconds spent by the bench, the limiter server and the Redis server during a phase."""

    def __init__(self, server_pid: int | None, redis_info: Callable[[], dict[str, Any]]) -> None:
        self._server_pid = server_pid
        self._redis_info = redis_info

    def sample(self) -> dict[str, float]:
        info = self._redis_info()
        sample = {
            "bench": cpu.process_seconds(os.getpid()),
            "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        }
        if self._server_pid is not None:
            sample["limiter"] = cpu.process_seconds(self._server_pid)
        return sample

    @contextmanager
    def window(self, phase: Phase) -> Iterator[None]:
        """Charge the CPU spent while the block runs to ``phase``."""
        before = self.sample()
        yield
        after = self.sample()
        phase.cpu_s = {name: after[name] - before[name] for name in before}


PairFn = Callable[..., Coroutine[Any, Any, None]]  # (phase, measuring, scheduled_start=None)


async def closed_loop(
    label: str, pair: PairFn, clients: int, warmup: float, duration: float, meter: CpuMeter
) -> Phase:
    phase = Phase(label)
    measuring = False
    stop_at = time.monotonic() + warmup + duration

    async def client() -> None:
        while time.monotonic() < stop_at:
            await pair(phase, measuring)

    print(f"{label}: {clients} clients, {warmup:.0f}s warm-up + {duration:.0f}s measured", flush=True)
    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(warmup)
    measuring = True
    phase.pairs = phase.errors = 0
    started = time.monotonic()
    with meter.window(phase), report.progress(label, lambda: phase.pairs):
        await asyncio.gather(*tasks)
        phase.elapsed = time.monotonic() - started
    return phase


def client_pair(address: str, pool: str, *, later: bool = False) -> tuple[Any, Callable[[object], float]]:
    """A LimiterClient, and one blocking Acquire+Release through it that returns when its Acquire
    was answered. ``later``: the Release is ``release_later``, not waited for, as the inference
    worker's hops release (it travels with the next Acquire)."""
    from services.limiter.client import LimiterClient
    from services.limiter.errors import LimiterError
    from services.limiter.model import Grant, Outcome

    client = LimiterClient(address, deadline_ms=5_000)

    def pair(_: object) -> float:
        grant = client.acquire(pool, "bench", 100, 100)
        answered = time.monotonic()
        if not isinstance(grant, Grant) or grant.emergency:
            raise LimiterError(f"not a limiter grant: {grant!r}")
        if later:
            client.release_later(grant.permit_id, Outcome.COMPLETED, 80, 20)
        else:
            client.release(grant.permit_id, Outcome.COMPLETED, 80, 20)
        return answered

    return client, pair


def threaded_loop(
    label: str,
    address: str,
    pool: str,
    clients: int,
    warmup: float,
    duration: float,
    meter: CpuMeter,
    later: bool = False,
) -> Phase:
    """The blocking LimiterClient the inference workers use, one thread per client, one channel."""
    from services.limiter.errors import LimiterError

    phase = Phase(label)
    client, pair = client_pair(address, pool, later=later)
    print(f"{label}: {clients} threads, {warmup:.0f}s warm-up + {duration:.0f}s measured", flush=True)
    try:
        calls = load.closed_loop(
            clients,
            lambda: nullcontext(client),
            pair,
            seconds=duration,
            warmup=warmup,
            failures=(LimiterError,),
            window=lambda: meter.window(phase),
        )
    finally:
        client.close()
    return _kept(phase, calls)


def threaded_open_loop(
    label: str, address: str, pool: str, rate: float, duration: float, meter: CpuMeter, later: bool = False
) -> Phase:
    """Open loop through LimiterClient, called as the inference worker's slots call it: from its own
    threads (OPEN_LOOP_THREADS), each sleeping until its share of the schedule comes up."""
    from services.limiter.errors import LimiterError

    client, blocking_pair = client_pair(address, pool, later=later)
    phase = Phase(label, offered=rate)
    started, lock = [0], threading.Lock()  # pairs started so far, for the progress line

    def pair(scheduled: float) -> float:
        with lock:
            started[0] += 1
        return blocking_pair(scheduled)

    print(f"{label}: {rate:,.0f} pairs/s offered for {duration:.0f}s", flush=True)
    try:
        with meter.window(phase), report.progress(label, lambda: started[0]):
            calls = load.threaded_open_loop(rate, duration, OPEN_LOOP_THREADS, pair, failures=(LimiterError,))
    finally:
        client.close()
    return _kept(phase, calls)


def _kept(phase: Phase, calls: load.Calls) -> Phase:
    """``phase`` with the pairs of ``calls``: each started (or scheduled) at its start, its Acquire
    answered at its value, its Release at its end."""
    for started, answered, ended in zip(calls.starts, calls.values, calls.ends, strict=True):
        phase.record(started, answered, ended)
    for failure in calls.failures:
        phase.fail(failure)
    phase.elapsed = calls.seconds
    return phase


async def open_loop(label: str, pair: PairFn, rate: float, duration: float, meter: CpuMeter) -> Phase:
    """Pairs start every 1/rate s whether or not earlier ones finished; latency from the schedule."""
    phase = Phase(label, offered=rate)
    print(f"{label}: {rate:,.0f} pairs/s offered for {duration:.0f}s", flush=True)
    started = time.monotonic()
    with meter.window(phase), report.progress(label, lambda: phase.pairs):
        await load.open_loop(rate, duration, lambda _, at: pair(phase, True, at), start_at=started)
        phase.elapsed = time.monotonic() - started
    return phase


def start_server(redis_url: str, config_text: str, prefix: str) -> tuple[Proc, str]:
    logs = report.OUT_DIR / "bench-limiter-logs"
    logs.mkdir(parents=True, exist_ok=True)
    config = logs / "limiter.toml"
    config.write_text(config_text, encoding="utf-8")
    port, metrics = free_port(), free_port()
    env = {
        "FATURA_REDIS_URL": redis_url,
        "FATURA_LIMITER_CONFIG": str(config.resolve()),
        "FATURA_LIMITER_PORT": str(port),
        "FATURA_LIMITER_METRICS_PORT": str(metrics),
        "FATURA_LIMITER_KEY_PREFIX": prefix,
    }
    ready = f"http://127.0.0.1:{metrics}/readyz"
    return spawn("limiter", ("run", "limiter"), logs / "limiter.log", env, ready), f"127.0.0.1:{port}"


def serving(address: str) -> bool:
    """The limiter at ``address`` reports SERVING on the gRPC health service."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    try:
        with grpc.insecure_channel(address) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    except grpc.RpcError:
        return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def p50_p99(values: list[float]) -> str:
    return f"{percentile(values, 0.5):7.2f}/{percentile(values, 0.99):<7.2f}"


def print_results(phases: list[Phase], ceiling: Phase) -> None:
    print()
    columns = ("acquire p50/p99 ms", "release p50/p99 ms", "pair p50/p99 ms")
    print(f"{'phase':<44} {'pairs/s':>8}  " + "  ".join(f"{c:<15}" for c in columns) + "  errors")
    for ph in phases:
        name = ph.name if ph.offered is None else f"{ph.name} {ph.offered:,.0f}/s"
        if ph.offered is not None and ph.rate < 0.95 * ph.offered:
            name += " OVERLOADED"
        row = f"{name:<44} {ph.rate:>8,.0f}  {p50_p99(ph.acquire_ms)}  {p50_p99(ph.release_ms)}"
        print(f"{row}  {p50_p99(ph.pair_ms)}  {ph.errors:>6}")
    for ph in phases:
        for sample in ph.error_samples:
            print(f"  error in {ph.name}: {sample}")
    if any(p.offered is not None and p.rate < 0.95 * p.offered for p in phases):
        print(
            "  OVERLOADED: more pairs offered than served; queue and latency grow while the rate lasts.\n"
            "  With thousands of calls queued, gRPC cancels some before the server sees them\n"
            "  (CANCELLED; seen against a no-op grpc.aio server too)."
        )
    print()
    print("CPU time per pair (microseconds; /proc for the processes, INFO cpu for Redis):")
    for ph in phases:
        if ph.pairs:
            name = ph.name if ph.offered is None else f"{ph.name} {ph.offered:,.0f}/s"
            parts = "  ".join(
                f"{who} {seconds / ph.pairs * 1e6:5.0f}" for who, seconds in sorted(ph.cpu_s.items())
            )
            print(f"  {name:<42} {parts}")
    print()
    print(
        f"goal: >= {GOAL_PAIRS_PER_S:,} pairs/s or >= {GOAL_RATIO:.0%} of the raw ceiling (closed loop), and "
        f"pair p99 <= {GOAL_P99_MS:.0f} ms in the open loop at {GOAL_OPEN_RATE:,.0f}/s"
    )
    for limiter in phases:
        if limiter is ceiling or limiter.offered is not None:
            continue
        ratio = limiter.rate / ceiling.rate if ceiling.rate else float("nan")
        line = f"  {limiter.name}: {limiter.rate:,.0f} pairs/s = {ratio:.0%} of the raw redis-py ceiling"
        line += f" ({ceiling.rate:,.0f} pairs/s, same run)"
        met = limiter.rate >= GOAL_PAIRS_PER_S or ratio >= GOAL_RATIO
        opened = [p for p in phases if p.name == f"{limiter.name}, open loop" and p.offered == GOAL_OPEN_RATE]
        if opened:
            p99 = percentile(opened[0].pair_ms, 0.99)
            met = met and p99 <= GOAL_P99_MS and not opened[0].errors
            line += f"; open loop {GOAL_OPEN_RATE:,.0f}/s pair p99 {p99:.2f} ms"
        else:
            met = False
            line += f"; no open loop at {GOAL_OPEN_RATE:,.0f}/s"
        print(f"{line}: {report.met(met).upper()}")


def chart(phases: list[Phase]) -> Any:
    fig, (left, right) = report.pyplot().subplots(1, 2, figsize=(12, 5))
    closed = [p for p in phases if p.offered is None]
    left.bar(range(len(closed)), [p.rate for p in closed])
    left.set_xticks(range(len(closed)), [p.name for p in closed], rotation=20, ha="right", fontsize=7)
    left.axhline(GOAL_PAIRS_PER_S, color="red", linestyle="--", label=f"goal {GOAL_PAIRS_PER_S:,}/s")
    if closed:
        ceiling = GOAL_RATIO * closed[0].rate
        left.axhline(ceiling, color="orange", linestyle=":", label=f"{GOAL_RATIO:.0%} of the raw ceiling")
    left.set(ylabel="Acquire+Release pairs/s", title="closed loop")
    left.legend(fontsize=8)
    xs = range(len(phases))
    for offset, q in ((-0.2, 0.5), (0.2, 0.99)):
        values = [percentile(p.pair_ms, q) for p in phases]
        right.bar([x + offset for x in xs], values, width=0.4, label=f"pair p{round(q * 100)}")
    right.axhline(GOAL_P99_MS, color="red", linestyle="--", label=f"goal p99 {GOAL_P99_MS:.0f} ms")
    labels = [p.name if p.offered is None else f"{p.name} {p.offered:,.0f}/s" for p in phases]
    right.set_xticks(list(xs), labels, rotation=30, ha="right", fontsize=6)
    right.set(ylabel="ms (log)", yscale="log", title="Acquire+Release pair latency")
    right.legend(fontsize=8)
    fig.suptitle("fatura bench limiter")
    fig.tight_layout()
    return fig


async def measure(
    args: argparse.Namespace, address: str, server_pid: int | None, prefix: str, config: Any
) -> None:
    import grpc
    import redis
    import redis.asyncio

    from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
    from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
    from services.limiter.model import AcquireRequest, Grant, Outcome
    from services.limiter.operations import KeyLayout, LimiterOps, Operation, ServerLimits
    from services.limiter.store import SCRIPT_NAMES, load_lua

    info_client = redis.Redis.from_url(args.redis_url)
    meter = CpuMeter(server_pid, lambda: info_client.info("cpu"))
    ops = LimiterOps(lambda: config, ServerLimits(), KeyLayout(prefix))
    # The ceiling calls the same scripts the way any redis-py user would: one EVALSHA per call
    # (redis-py's Script object), 32 at a time, with the same operations building keys and args.
    raw_client = redis.asyncio.Redis.from_url(args.redis_url, max_connections=args.clients + 4)
    scripts = {name: raw_client.register_script(load_lua(name)) for name in SCRIPT_NAMES}

    async def raw(op: Operation[Any]) -> Any:
        reply = await scripts[op.script](keys=op.keys, args=op.args)
        return op.interpret([x.decode() if isinstance(x, bytes) else x for x in reply])

    async def raw_pair(phase: Phase, measuring: bool, at: float | None = None) -> None:
        t0 = at if at is not None else time.monotonic()
        try:
            grant = await raw(ops.acquire(AcquireRequest(args.pool, "bench", 100, 100, 0, uuid.uuid4().hex)))
            t1 = time.monotonic()
            assert isinstance(grant, Grant), grant
            await raw(ops.release(grant.permit_id, Outcome.COMPLETED, 80, 20))
        except Exception as exc:  # counted and shown; a benchmark keeps going
            if measuring:
                phase.fail(repr(exc))
            return
        if measuring:
            phase.record(t0, t1, time.monotonic())

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.LimiterServiceStub(channel)

    async def grpc_pair(phase: Phase, measuring: bool, at: float | None = None) -> None:
        t0 = at if at is not None else time.monotonic()
        try:
            reply = await stub.Acquire(
                pb.AcquireRequest(
                    pool=args.pool,
                    tenant="bench",
                    estimated_input_tokens=100,
                    max_output_tokens=100,
                    request_key=uuid.uuid4().hex,
                ),
                timeout=5,
            )
            t1 = time.monotonic()
            await stub.Release(
                pb.ReleaseRequest(
                    permit_id=reply.granted.permit_id,
                    outcome=pb.OUTCOME_COMPLETED,
                    input_tokens=80,
                    output_tokens=20,
                ),
                timeout=5,
            )
        except grpc.RpcError as exc:
            if measuring:
                phase.fail(f"{exc.code().name}: {exc.details()}")
            return
        if measuring:
            phase.record(t0, t1, time.monotonic())

    held: list[str] = []  # granted by Batch pairs; each is released by the next Batch pair to start

    async def batch_pair(phase: Phase, measuring: bool, at: float | None = None) -> None:
        """A slot's Release and its next Acquire in one Batch RPC (the first pair only acquires)."""
        t0 = at if at is not None else time.monotonic()
        items = []
        if held:
            released = pb.ReleaseRequest(
                permit_id=held.pop(), outcome=pb.OUTCOME_COMPLETED, input_tokens=80, output_tokens=20
            )
            items.append(pb.BatchItem(release=released))
        acquire = pb.AcquireRequest(
            pool=args.pool,
            tenant="bench",
            estimated_input_tokens=100,
            max_output_tokens=100,
            request_key=uuid.uuid4().hex,
        )
        items.append(pb.BatchItem(acquire=acquire))
        try:
            reply = await stub.Batch(pb.BatchRequest(items=items), timeout=5)
        except grpc.RpcError as exc:
            if measuring:
                phase.fail(f"{exc.code().name}: {exc.details()}")
            return
        answered = time.monotonic()
        errors = [r.error.message for r in reply.results if r.WhichOneof("result") == "error"]
        granted = reply.results[-1].acquire
        if errors or granted.WhichOneof("result") != "granted":
            if measuring:
                phase.fail(f"errors {errors}, acquire {granted}")
            return
        held.append(granted.granted.permit_id)
        if measuring:
            phase.record_batch(t0, answered)

    async def release_held() -> None:
        while held:
            chunk, held[:] = held[:256], held[256:]
            items = [
                pb.BatchItem(release=pb.ReleaseRequest(permit_id=p, outcome=pb.OUTCOME_NOT_SENT))
                for p in chunk
            ]
            await stub.Batch(pb.BatchRequest(items=items), timeout=5)

    batch_label = "limiter (gRPC Batch: Release + next Acquire)"
    client_label = "limiter (LimiterClient, threads)"
    later_label = "limiter (LimiterClient, release_later)"
    phases = [
        await closed_loop("redis-py (raw Lua)", raw_pair, args.clients, args.warmup, args.duration, meter),
        await closed_loop("limiter (gRPC)", grpc_pair, args.clients, args.warmup, args.duration, meter),
        await closed_loop(batch_label, batch_pair, args.clients, args.warmup, args.duration, meter),
    ]
    await release_held()
    # The waited-for pair, then the worker's own path (its hop's Release is not waited for).
    clients = ((client_label, False), (later_label, True)) if args.threads_phase else ()
    for label, later in clients:
        phases.append(
            await asyncio.to_thread(
                threaded_loop,
                label,
                address,
                args.pool,
                args.clients,
                args.warmup,
                args.duration,
                meter,
                later,
            )
        )
    for rate in [float(r) for r in args.open_rates.split(",") if r.strip()]:
        phases.append(
            await open_loop("limiter (gRPC), open loop", grpc_pair, rate, args.open_duration, meter)
        )
        phases.append(
            await open_loop(f"{batch_label}, open loop", batch_pair, rate, args.open_duration, meter)
        )
        await release_held()
        for label, later in clients:
            phases.append(
                await asyncio.to_thread(
                    threaded_open_loop,
                    f"{label}, open loop",
                    address,
                    args.pool,
                    rate,
                    args.open_duration,
                    meter,
                    later,
                )
            )
    await channel.close()
    await raw_client.aclose()
    info_client.close()
    print_results(phases, phases[0])
    report.save(args.out, chart(phases), {"phases": [phase.figures() for phase in phases]})


def run(args: argparse.Namespace) -> int:
    from services.common.settings import CommonSettings
    from services.limiter.config import parse_config

    args.redis_url = args.redis_url or CommonSettings.from_env().redis_url
    prefix = f"fatura:bench:{uuid.uuid4().hex[:8]}"
    config_text = POOL_TOML.format(pool=args.pool)
    report.header(
        "limiter",
        f"{args.clients} clients, {args.duration:g} s per closed-loop phase, open loop at "
        f"{args.open_rates or 'no rate'} pairs/s",
    )
    server: Proc | None = None
    try:
        if args.address:
            address = args.address
            if not serving(address):
                raise SystemExit(f"no limiter reports SERVING at {address}")
            print(f"using the limiter at {address} (pool {args.pool!r}); its CPU is not measured")
        else:
            server, address = start_server(args.redis_url, config_text, prefix)
            print(f"started a limiter (pid {server.pid}) at {address}", end="")
            print(f" on {args.redis_url}, key prefix {prefix}; its log is {server.log_path}")
        config = parse_config(config_text)
        asyncio.run(measure(args, address, server.pid if server else None, prefix, config))
    finally:
        if server is not None:
            server.stop()
        resources.delete_keys(args.redis_url, f"{prefix}:")
    return 0
