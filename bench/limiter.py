"""``fatura bench limiter``: Acquire+Release pairs through the limiter, beside the same Lua scripts
called straight through redis-py, in the same run.

Closed loop: N concurrent clients (default 32), each doing Acquire then Release as fast as answers
come back: first the scripts through redis-py (the ceiling), then the limiter through a grpc.aio
client, then through the blocking ``LimiterClient`` with one thread per client (as workers use it).
Reported: pairs/s, p50/p99 of each RPC and of the pair, and the CPU each process spent per pair
(bench, limiter server, the whole Redis server) to show where time goes.
Open loop (``--open-rates``): pairs start on a fixed schedule and latency counts from the
scheduled start, so a slow server cannot hide its queue (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POOL_TOML = """
[pools.{pool}]
rpm = 1000000000
tpm = 1000000000000
max_in_flight = 1000000
"""
GOAL_PAIRS_PER_S = 3_000
GOAL_P99_MS = 5.0


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
    p.add_argument("--out", type=Path, default=Path("out") / "bench_limiter.png", help="chart path")


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

    def fail(self, description: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(description)

    @property
    def rate(self) -> float:
        return self.pairs / self.elapsed if self.elapsed else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds spent by the bench, the limiter server and the Redis server during a phase."""

    def __init__(self, server_pid: int | None, redis_info: Callable[[], dict[str, Any]]) -> None:
        self._server_pid = server_pid
        self._redis_info = redis_info

    def sample(self) -> dict[str, float]:
        info = self._redis_info()
        own = os.times()
        sample = {
            "bench": own.user + own.system,
            "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        }
        if self._server_pid is not None:
            sample["limiter"] = proc_cpu_s(self._server_pid)
        return sample

    @staticmethod
    def delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {name: after[name] - before[name] for name in before}


async def progress(label: str, phase: Phase, started: float, duration: float) -> None:
    while True:
        await asyncio.sleep(1.0)
        seconds = time.perf_counter() - started
        rate = phase.pairs / seconds
        print(
            f"  {label}: {seconds:4.1f}/{duration:.0f}s {phase.pairs:>8,} pairs {rate:>7,.0f} pairs/s",
            flush=True,
        )


PairFn = Callable[..., Awaitable[None]]  # (phase, measuring, scheduled_start=None)


async def closed_loop(
    label: str, pair: PairFn, clients: int, warmup: float, duration: float, meter: CpuMeter
) -> Phase:
    phase = Phase(label)
    measuring = False
    stop_at = time.perf_counter() + warmup + duration

    async def client() -> None:
        while time.perf_counter() < stop_at:
            await pair(phase, measuring)

    print(f"{label}: {clients} clients, {warmup:.0f}s warm-up + {duration:.0f}s measured", flush=True)
    tasks = [asyncio.create_task(client()) for _ in range(clients)]
    await asyncio.sleep(warmup)
    measuring = True
    phase.pairs = phase.errors = 0
    before, started = meter.sample(), time.perf_counter()
    reporter = asyncio.create_task(progress(label, phase, started, duration))
    await asyncio.gather(*tasks)
    phase.elapsed = time.perf_counter() - started
    phase.cpu_s = CpuMeter.delta(before, meter.sample())
    reporter.cancel()
    return phase


def threaded_loop(
    label: str, address: str, pool: str, clients: int, warmup: float, duration: float, meter: CpuMeter
) -> Phase:
    """The blocking LimiterClient the inference workers use, one thread per client, one channel."""
    import threading

    from services.limiter.client import LimiterClient
    from services.limiter.errors import LimiterError
    from services.limiter.model import Grant, Outcome

    phase = Phase(label)
    client = LimiterClient(address, deadline_ms=5_000)
    lock = threading.Lock()
    start_at = time.perf_counter() + warmup
    stop_at = start_at + duration

    def worker() -> None:
        pairs: list[tuple[float, float, float]] = []
        errors: list[str] = []
        while (t0 := time.perf_counter()) < stop_at:
            try:
                grant = client.acquire(pool, "bench", 100, 100)
                t1 = time.perf_counter()
                if not isinstance(grant, Grant) or grant.emergency:
                    raise LimiterError(f"not a limiter grant: {grant!r}")
                client.release(grant.permit_id, Outcome.COMPLETED, 80, 20)
            except LimiterError as exc:
                if t0 >= start_at:
                    errors.append(repr(exc))
                continue
            if t0 >= start_at:
                pairs.append((t0, t1, time.perf_counter()))
        with lock:  # the measured figures are merged once, at the end
            for times in pairs:
                phase.record(*times)
            for error in errors:
                phase.fail(error)

    print(f"{label}: {clients} threads, {warmup:.0f}s warm-up + {duration:.0f}s measured", flush=True)
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start_at - time.perf_counter()))
    before = meter.sample()
    for thread in threads:
        thread.join()
    phase.elapsed = time.perf_counter() - start_at
    phase.cpu_s = CpuMeter.delta(before, meter.sample())
    client.close()
    return phase


async def open_loop(label: str, pair: PairFn, rate: float, duration: float, meter: CpuMeter) -> Phase:
    """Pairs start every 1/rate s whether or not earlier ones finished; latency from the schedule."""
    phase = Phase(label, offered=rate)
    print(f"{label}: {rate:,.0f} pairs/s offered for {duration:.0f}s", flush=True)
    total = int(rate * duration)
    outstanding: set[asyncio.Task[None]] = set()
    before, started = meter.sample(), time.perf_counter()
    reporter = asyncio.create_task(progress(label, phase, started, duration))

    for i in range(total):
        at = started + i / rate
        delay = at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(pair(phase, True, at))
        outstanding.add(task)
        task.add_done_callback(outstanding.discard)
    await asyncio.gather(*list(outstanding))
    phase.elapsed = time.perf_counter() - started
    phase.cpu_s = CpuMeter.delta(before, meter.sample())
    reporter.cancel()
    return phase


def start_server(redis_url: str, config: Path, prefix: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    port = free_port()
    log_path = config.with_suffix(".log")
    env = {
        **os.environ,
        "FATURA_REDIS_URL": redis_url,
        "FATURA_LIMITER_CONFIG": str(config),
        "FATURA_LIMITER_PORT": str(port),
        "FATURA_LIMITER_METRICS_PORT": str(free_port()),
        "FATURA_LIMITER_KEY_PREFIX": prefix,
    }
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "services.limiter.server"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    return process, f"127.0.0.1:{port}", log_path


def wait_serving(address: str, process: subprocess.Popen[bytes] | None, log_path: Path | None) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            log = log_path.read_text() if log_path else ""
            raise SystemExit(f"limiter exited with {process.returncode}:\n{log}")
        try:
            with grpc.insecure_channel(address) as channel:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"limiter at {address} did not report SERVING within 30 s")


def p50_p99(values: list[float]) -> str:
    return f"{percentile(values, 0.5):7.2f}/{percentile(values, 0.99):<7.2f}"


def report(phases: list[Phase], ceiling: Phase, limiter: Phase) -> None:
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
    ratio = limiter.rate / ceiling.rate if ceiling.rate else float("nan")
    print()
    print(f"limiter: {limiter.rate:,.0f} pairs/s = {ratio:.0%} of the raw redis-py ceiling", end="")
    print(f" ({ceiling.rate:,.0f} pairs/s, same run)")
    p99 = max(percentile(limiter.acquire_ms, 0.99), percentile(limiter.release_ms, 0.99))
    met = limiter.rate >= GOAL_PAIRS_PER_S and p99 <= GOAL_P99_MS
    print(
        f"goal >= {GOAL_PAIRS_PER_S:,} pairs/s with p99 <= {GOAL_P99_MS:.0f} ms per RPC (closed loop): "
        f"{'MET' if met else 'NOT MET'} ({limiter.rate:,.0f} pairs/s, worst RPC p99 {p99:.2f} ms)"
    )


def chart(path: Path, phases: list[Phase]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    closed = [p for p in phases if p.offered is None]
    left.bar([p.name for p in closed], [p.rate for p in closed])
    left.axhline(GOAL_PAIRS_PER_S, color="red", linestyle="--", label=f"goal {GOAL_PAIRS_PER_S:,}/s")
    left.set(ylabel="Acquire+Release pairs/s", title="closed loop")
    left.tick_params(axis="x", labelsize=7)
    left.legend()
    xs = range(len(phases))
    for offset, q in ((-0.2, 0.5), (0.2, 0.99)):
        values = [percentile(p.acquire_ms, q) for p in phases]
        right.bar([x + offset for x in xs], values, width=0.4, label=f"Acquire p{round(q * 100)}")
    right.axhline(GOAL_P99_MS, color="red", linestyle="--", label=f"goal p99 {GOAL_P99_MS:.0f} ms")
    labels = [p.name if p.offered is None else f"open loop {p.offered:,.0f}/s" for p in phases]
    right.set_xticks(list(xs), labels, rotation=20, ha="right", fontsize=7)
    right.set(ylabel="ms (log)", yscale="log", title="Acquire latency")
    right.legend(fontsize=8)
    fig.suptitle("fatura bench limiter")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"chart: {path}")


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
        t0 = at if at is not None else time.perf_counter()
        try:
            grant = await raw(ops.acquire(AcquireRequest(args.pool, "bench", 100, 100, 0, uuid.uuid4().hex)))
            t1 = time.perf_counter()
            assert isinstance(grant, Grant), grant
            await raw(ops.release(grant.permit_id, Outcome.COMPLETED, 80, 20))
        except Exception as exc:  # counted and shown; a benchmark keeps going
            if measuring:
                phase.fail(repr(exc))
            return
        if measuring:
            phase.record(t0, t1, time.perf_counter())

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.LimiterServiceStub(channel)

    async def grpc_pair(phase: Phase, measuring: bool, at: float | None = None) -> None:
        t0 = at if at is not None else time.perf_counter()
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
            t1 = time.perf_counter()
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
            phase.record(t0, t1, time.perf_counter())

    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at start")
    phases = [
        await closed_loop("redis-py (raw Lua)", raw_pair, args.clients, args.warmup, args.duration, meter),
        await closed_loop("limiter (gRPC)", grpc_pair, args.clients, args.warmup, args.duration, meter),
    ]
    if args.threads_phase:
        label = "limiter (LimiterClient, threads)"
        phases.append(
            await asyncio.to_thread(
                threaded_loop, label, address, args.pool, args.clients, args.warmup, args.duration, meter
            )
        )
    for rate in [float(r) for r in args.open_rates.split(",") if r.strip()]:
        phases.append(
            await open_loop("limiter (gRPC), open loop", grpc_pair, rate, args.open_duration, meter)
        )
    await channel.close()
    await raw_client.aclose()
    info_client.close()
    report(phases, phases[0], phases[1])
    chart(args.out, phases)


def delete_keys(redis_url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    batch = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(batch), 1000):
        client.delete(*batch[start : start + 1000])
    client.close()


def run(args: argparse.Namespace) -> int:
    from services.common.settings import CommonSettings
    from services.limiter.config import parse_config

    args.redis_url = args.redis_url or CommonSettings.from_env().redis_url
    prefix = f"fatura:bench:{uuid.uuid4().hex[:8]}"
    config_text = POOL_TOML.format(pool=args.pool)
    config = parse_config(config_text)
    process: subprocess.Popen[bytes] | None = None
    log_path: Path | None = None
    with tempfile.TemporaryDirectory(prefix="bench-limiter-") as tmp:
        config_path = Path(tmp) / "limiter.toml"
        config_path.write_text(config_text)
        try:
            if args.address:
                address = args.address
                print(f"using the limiter at {address} (pool {args.pool!r}); its CPU is not measured")
            else:
                process, address, log_path = start_server(args.redis_url, config_path, prefix)
                print(f"started a limiter (pid {process.pid}) at {address}", end="")
                print(f" on {args.redis_url}, key prefix {prefix}")
            wait_serving(address, process, log_path)
            asyncio.run(measure(args, address, process.pid if process else None, prefix, config))
        finally:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=30)
            delete_keys(args.redis_url, prefix)
    return 0
