"""``fatura bench gateway``: what the provider gateway adds to one call, beside a bare httpx call to
the same simulated provider in the same run.

The simulated provider runs with zero latency and no limits, so nearly all of a call is HTTP and
JSON on this machine. Both series make the same streamed request over the same kind of pooled
client and read the stream to its end; calls alternate (bare, gateway, gateway, bare, ...) so
drift on a shared machine hits both alike. The gateway's extra work per call: the circuit
breaker's admission (one Redis script, or none while the channel is remembered as spotless,
``FATURA_PROVIDER_BREAKER_HEALTHY_CACHE_MS``), permits (a no-op here: the limiter is benchmarked by
``fatura bench limiter``), frame parsing, the hop record and its metrics. Goal: <= 2 ms added at p99.
CPU per call (this process, both threads) is printed too: unlike latency, it barely moves when other
work shares the machine's cores.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import httpx

from bench import report, resources
from bench.procs import Proc, spawn
from bench.report import percentile
from services.common.procs import free_port
from services.inference.prompt import build_messages
from services.inference.providers.base import PermitDenied, PermitGranted, ProviderRequest
from services.inference.providers.breaker_store import RedisBreakers, connect
from services.inference.providers.catalog import parse_catalog
from services.inference.providers.exchange import request_body
from services.inference.providers.gateway import Gateway, http_transport
from services.inference.providers.settings import GatewaySettings
from services.sandbox.samples import SAMPLES_DIR

MODEL = "fatura-sim-1"
GOAL_ADDED_P99_MS = 2.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--calls", type=int, default=3000, help="measured calls per series (default 3000)")
    p.add_argument("--warmup", type=int, default=200, help="unmeasured calls per series first")
    p.add_argument("--base-url", help="bench this running provider (…/v1) instead of starting one")
    p.add_argument("--redis-url", help="Redis for the circuit breaker (default FATURA_REDIS_URL)")
    report.add_out_argument(p, "bench-gateway.png")


class NoPermits:
    def acquire(self, pool: str) -> PermitGranted | PermitDenied:
        return PermitGranted("bench")

    def release(self, permit: PermitGranted, outcome: str, input_tokens: int, output_tokens: int) -> None:
        pass

    def throttle(self, pool: str, retry_after_ms: int) -> None:
        pass


def start_provider(port: int) -> Proc:
    """The simulated provider with zero latency and no limits."""
    env = {"FATURA_SANDBOX_PROVIDER_PORT": str(port), "FATURA_LOG_LEVEL": "WARNING"}
    env |= {f"FATURA_SANDBOX_PROVIDER_{name}": "0" for name in ("LATENCY_MS", "RPM", "TPM", "CONCURRENCY")}
    env["FATURA_SANDBOX_PROVIDER_API_KEY"] = ""
    log = report.OUT_DIR / "bench-gateway-logs" / "provider.log"
    return spawn("provider", ("sandbox", "provider"), log, env, f"http://127.0.0.1:{port}/readyz")


CPU_MS: dict[int, float] = {}  # id(series) -> CPU ms this process spent on it


def measure(fn: Callable[[], None], into: list[float], n: int) -> None:
    for _ in range(n):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        into.append((time.perf_counter() - t0) * 1000)
        CPU_MS[id(into)] = CPU_MS.get(id(into), 0.0) + (time.process_time() - c0) * 1000


def run(args: argparse.Namespace) -> int:
    base_settings = GatewaySettings.from_env()
    redis_url = args.redis_url or base_settings.redis_url
    prefix = f"bench:breaker:{uuid.uuid4().hex[:8]}"
    report.header("gateway", f"{args.calls} calls per series, alternating, after {args.warmup} unmeasured")
    port = free_port()
    base_url = args.base_url.rstrip("/") if args.base_url else f"http://127.0.0.1:{port}/v1"
    try:
        with nullcontext() if args.base_url else start_provider(port):
            measure_calls(args, base_settings, redis_url, prefix, base_url)
    finally:
        resources.delete_keys(redis_url, f"{prefix}:")
    return 0


def measure_calls(
    args: argparse.Namespace, base_settings: GatewaySettings, redis_url: str, prefix: str, base_url: str
) -> None:
    raw = {
        "channels": {"bench": {"serves": MODEL, "base_url": base_url, "pool": "bench"}},
        "models": {MODEL: {"chain": ["bench"]}},
    }
    catalog = parse_catalog(raw, {})
    channel = catalog.chains[MODEL][0]
    cache_ms = base_settings.breaker_healthy_cache_ms
    breakers = RedisBreakers(connect(redis_url), prefix, base_settings.breaker, healthy_cache_ms=cache_ms)
    gateway = Gateway(catalog, base_settings, breakers)
    uncached = RedisBreakers(connect(redis_url), prefix, base_settings.breaker)
    bare_client = httpx.Client(transport=http_transport(base_settings), follow_redirects=False)
    text = (SAMPLES_DIR / "01_tr_kirtasiye_try.txt").read_text(encoding="utf-8")
    request = ProviderRequest(MODEL, build_messages(text, nonce="0" * 16), 2048, 30.0, "bench:1")
    body = request_body(channel, request)
    headers = {"accept": "text/event-stream", "x-request-id": request.request_id}
    permits = NoPermits()

    def bare() -> None:
        with bare_client.stream("POST", channel.url, json=body, headers=headers) as response:
            for _ in response.iter_lines():
                pass
            if response.status_code != 200:
                raise SystemExit(f"the provider answered {response.status_code}")

    def through_gateway() -> None:
        result = gateway.complete(request, permits)
        if not result.ok:
            raise SystemExit(f"the gateway call failed: {result.error_class} {result.error_message}")

    def admit() -> None:
        uncached.admit(channel.name)

    series: dict[str, list[float]] = {"bare httpx": [], "gateway": [], "breaker admit (Redis)": []}
    scratch: list[float] = []
    print(
        f"provider {base_url} (zero latency), breaker in {redis_url} (healthy cache {cache_ms} ms);"
        f" warmup {args.warmup} calls each"
    )
    measure(bare, scratch, args.warmup)
    measure(through_gateway, scratch, args.warmup)
    with report.progress("calls each", lambda: len(series["gateway"]), args.calls):
        for i in range(args.calls):
            first, second = ("bare httpx", "gateway") if i % 2 == 0 else ("gateway", "bare httpx")
            for name in (first, second):
                measure(bare if name == "bare httpx" else through_gateway, series[name], 1)
    measure(admit, series["breaker admit (Redis)"], args.calls)
    gateway.close()
    bare_client.close()
    print_results(series, args.out)


def print_results(series: dict[str, list[float]], out: Path) -> None:
    figures: dict[str, Any] = {}
    print()
    for name, values in series.items():
        p50, p99 = percentile(values, 0.50), percentile(values, 0.99)
        figures[name] = {"calls": len(values), "p50_ms": round(p50, 3), "p99_ms": round(p99, 3)}
        cpu = CPU_MS.get(id(values), 0.0) / max(1, len(values))
        figures[name]["cpu_ms_per_call"] = round(cpu, 3)
        print(
            f"{name:<24} p50 {p50:7.3f} ms   p99 {p99:7.3f} ms   CPU {cpu:6.3f} ms/call"
            f"   ({len(values)} calls)"
        )
    bare, gw = figures["bare httpx"], figures["gateway"]
    added_p50 = gw["p50_ms"] - bare["p50_ms"]
    added_p99 = gw["p99_ms"] - bare["p99_ms"]
    ratio = gw["p99_ms"] / bare["p99_ms"]
    verdict = report.met(added_p99 <= GOAL_ADDED_P99_MS)
    added_cpu = gw["cpu_ms_per_call"] - bare["cpu_ms_per_call"]
    print(
        f"{'added by the gateway':<24} p50 {added_p50:+7.3f} ms   p99 {added_p99:+7.3f} ms"
        f"   CPU {added_cpu:+6.3f} ms/call"
    )
    print(f"gateway p99 / bare p99 = {ratio:.2f}x; goal <= {GOAL_ADDED_P99_MS:g} ms added at p99: {verdict}")
    figures["added"] = {
        "p50_ms": round(added_p50, 3),
        "p99_ms": round(added_p99, 3),
        "p99_ratio": round(ratio, 3),
    }
    report.save(out, chart(series, added_p99, ratio), figures)


def chart(series: dict[str, list[float]], added_p99: float, ratio: float) -> Any:
    fig, ax = report.pyplot().subplots(figsize=(8, 4.5))
    for name, values in series.items():
        ordered = sorted(values)
        ax.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=name)
    ax.axhline(0.99, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("latency per call (ms, log scale)")
    ax.set_ylabel("share of calls")
    ax.set_title(f"Gateway vs bare httpx, zero-latency provider: +{added_p99:.2f} ms at p99 ({ratio:.2f}x)")
    ax.legend(loc="lower right")
    ax.grid(True, which="both", alpha=0.3)
    return fig
