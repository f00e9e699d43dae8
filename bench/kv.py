"""``fatura bench kv``: a mix of short and very long invoices against the simulated vLLM server,
admitted by request count beside admitted by KV tokens, in the same run.

Two simulated vLLM servers (``FATURA_SANDBOX_PROVIDER_MODE=vllm``, the same engine settings) and
one limiter with two pools: ``count`` (a hosted pool: ``max_in_flight`` = the server's
``max_num_seqs``) and ``kv`` (a local pool whose ``kv_blocks * block_size`` is the server's
cache). The same jobs, in the same order, go through each side at once: Acquire (waiting out
denials), the chat completion, Release with the reported usage. Reported per side: completed
jobs/s, p50/p99 job latency (first Acquire to Release), preemptions and the peak KV usage
(``vllm:gpu_cache_usage_perc``, sampled); the chart shows KV usage over time for both.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from bench import report
from bench.procs import Proc, spawn
from bench.report import percentile
from services.common.procs import free_port

MODEL = "fatura-sim-1"
SIDES = ("count", "kv")
PADDING = (
    "Terms and conditions. Payment is due within thirty days of the invoice date; late payments "
    "bear interest at the statutory rate. Goods remain our property until paid in full. "
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--jobs", type=int, default=240, help="jobs per side (default 240)")
    p.add_argument(
        "--long-share", type=float, default=0.25, help="share of very long invoices (default 0.25)"
    )
    p.add_argument("--long-tokens", type=int, default=20_000, help="prompt tokens of a long invoice")
    p.add_argument("--max-output", type=int, default=600, help="max_tokens of every request (default 600)")
    p.add_argument("--clients", type=int, default=64, help="concurrent jobs per side (default 64)")
    p.add_argument("--kv-blocks", type=int, default=3_000, help="the server's KV blocks (default 3000)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--max-num-seqs", type=int, default=32, help="the server's max_num_seqs (default 32)")
    p.add_argument("--seed", type=int, default=7)
    report.add_out_argument(p, "bench_kv.png")


@dataclass
class Side:
    name: str
    latencies_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    usage: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, fraction)
    preemptions: float = 0.0

    @property
    def rate(self) -> float:
        span = self.ended - self.started
        return len(self.latencies_s) / span if span > 0 else 0.0


def documents(args: argparse.Namespace) -> list[str]:
    from services.sandbox.samples import load_samples

    rng = random.Random(args.seed)
    shorts = [sample.text for sample in load_samples()]
    docs = []
    for _ in range(args.jobs):
        base = rng.choice(shorts)
        if rng.random() < args.long_share:
            repeats = max(1, (args.long_tokens * 4 - len(base)) // len(PADDING))
            base = base + "\n" + PADDING * repeats
        docs.append(base)
    return docs


def start_stack(args: argparse.Namespace, logs: Any) -> tuple[list[Proc], str, dict[str, str]]:
    config = logs / "limiter.toml"
    config.write_text(
        f"""
[pools.count]
rpm = 1000000000
tpm = 1000000000000
max_in_flight = {args.max_num_seqs}

[pools.kv]
kind = "local"
rpm = 1000000000
tpm = 1000000000000
max_in_flight = {args.clients}
kv_blocks = {args.kv_blocks}
block_size = {args.block_size}
""",
        encoding="utf-8",
    )
    port, metrics = free_port(), free_port()
    procs = [
        spawn(
            "limiter",
            ("run", "limiter"),
            logs / "limiter.log",
            {
                "FATURA_LIMITER_CONFIG": str(config.resolve()),
                "FATURA_LIMITER_PORT": str(port),
                "FATURA_LIMITER_METRICS_PORT": str(metrics),
                "FATURA_LIMITER_KEY_PREFIX": f"bench-kv-{uuid.uuid4().hex[:8]}",
            },
            f"http://127.0.0.1:{metrics}/readyz",
        )
    ]
    providers = {}
    for side in SIDES:
        provider_port = free_port()
        env = {
            "FATURA_SANDBOX_PROVIDER_PORT": str(provider_port),
            "FATURA_SANDBOX_PROVIDER_MODE": "vllm",
            "FATURA_SANDBOX_VLLM_KV_BLOCKS": str(args.kv_blocks),
            "FATURA_SANDBOX_VLLM_BLOCK_SIZE": str(args.block_size),
            "FATURA_SANDBOX_VLLM_MAX_NUM_SEQS": str(args.max_num_seqs),
        }
        url = f"http://127.0.0.1:{provider_port}"
        procs.append(
            spawn(
                f"provider-{side}",
                ("sandbox", "provider"),
                logs / f"provider-{side}.log",
                env,
                f"{url}/readyz",
            )
        )
        providers[side] = url
    return procs, f"127.0.0.1:{port}", providers


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.eE+-]+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def run_side(side: Side, docs: list[str], args: argparse.Namespace, address: str, url: str) -> None:
    import grpc
    import httpx

    from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
    from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc

    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.LimiterServiceStub(channel)
    queue: asyncio.Queue[str] = asyncio.Queue()
    for doc in docs:
        queue.put_nowait(doc)

    async def job(client: httpx.AsyncClient, doc: str) -> None:
        t0 = time.monotonic()
        # The provider counts ceil(chars / 4) plus a few tokens per message: reserve at least that.
        estimate = -(-len(doc) // 4) + 16
        key = uuid.uuid4().hex
        while True:
            reply = await stub.Acquire(
                pb.AcquireRequest(
                    pool=side.name,
                    tenant="bench",
                    estimated_input_tokens=estimate,
                    max_output_tokens=args.max_output,
                    request_key=key,
                ),
                timeout=10,
            )
            if reply.HasField("granted"):
                break
            # The same request_key when asking again: it keeps its place in a local pool's KV line.
            await asyncio.sleep(min(reply.denied.retry_after_ms, 50) / 1000)
        permit = reply.granted.permit_id
        usage = {"prompt_tokens": 0, "completion_tokens": 0}
        try:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": doc}],
                "max_tokens": args.max_output,
            }
            answer = await client.post(f"{url}/v1/chat/completions", json=body)
            answer.raise_for_status()
            usage = answer.json()["usage"]
            side.latencies_s.append(time.monotonic() - t0)
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            side.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            await stub.Release(
                pb.ReleaseRequest(
                    permit_id=permit,
                    outcome=pb.OUTCOME_COMPLETED,
                    input_tokens=usage["prompt_tokens"],
                    output_tokens=usage["completion_tokens"],
                ),
                timeout=10,
            )

    async def client_loop(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            await job(client, queue.get_nowait())

    async def sample(client: httpx.AsyncClient) -> None:
        while True:
            text = (await client.get(f"{url}/metrics")).text
            side.usage.append((time.monotonic() - side.started, metric(text, "vllm:gpu_cache_usage_perc")))
            await asyncio.sleep(0.2)

    limits = httpx.Limits(max_connections=args.clients + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        side.started = time.monotonic()
        sampler = asyncio.create_task(sample(client))
        await asyncio.gather(*(client_loop(client) for _ in range(args.clients)))
        side.ended = time.monotonic()
        sampler.cancel()
        text = (await client.get(f"{url}/metrics")).text
        side.preemptions = metric(text, "vllm:num_preemptions_total")
    await channel.close()


def print_results(sides: list[Side], args: argparse.Namespace) -> None:
    print()
    print(
        f"{'admission':<22} {'jobs':>5} {'jobs/s':>7} {'p50 s':>7} {'p99 s':>7}"
        f" {'preemptions':>12} {'peak KV':>8}  errors"
    )
    for s in sides:
        peak = max((u for _, u in s.usage), default=0.0)
        print(
            f"{'by ' + ('request count' if s.name == 'count' else 'KV tokens'):<22} {len(s.latencies_s):>5}"
            f" {s.rate:>7.2f} {percentile(s.latencies_s, 0.5):>7.2f} {percentile(s.latencies_s, 0.99):>7.2f}"
            f" {s.preemptions:>12.0f} {peak:>8.0%}  {len(s.errors)}"
        )
        for error in s.errors[:3]:
            print(f"  error ({s.name}): {error}")
    count, kv = sides
    rate_ratio = kv.rate / count.rate if count.rate else float("nan")
    p99_ratio = percentile(kv.latencies_s, 0.99) / max(percentile(count.latencies_s, 0.99), 1e-9)
    print()
    print(
        f"KV-token admission: {rate_ratio:.2f}x the throughput and {p99_ratio:.2f}x the p99"
        " of request-count admission"
    )
    ok = kv.preemptions == 0 and p99_ratio <= 1.0 and rate_ratio >= 1.0 and not kv.errors
    print(f"goal zero preemptions, p99 no worse, throughput equal or better: {report.met(ok).upper()}")


def chart(sides: list[Side]) -> Any:
    fig, ax = report.pyplot().subplots(1, 1, figsize=(9, 4))
    for s in sides:
        label = (
            f"by {'request count' if s.name == 'count' else 'KV tokens'} ({s.preemptions:.0f} preemptions)"
        )
        ax.plot([t for t, _ in s.usage], [u * 100 for _, u in s.usage], label=label)
    ax.set(xlabel="seconds", ylabel="vllm:gpu_cache_usage_perc (%)", ylim=(0, 105), title="KV cache usage")
    ax.legend()
    fig.suptitle(f"fatura bench kv ({report.machine()})", fontsize=9)
    return fig


def run(args: argparse.Namespace) -> int:
    logs = report.OUT_DIR / "bench-kv-logs"
    logs.mkdir(parents=True, exist_ok=True)
    docs = documents(args)
    long_jobs = sum(len(d) > args.long_tokens * 2 for d in docs)
    report.header(
        "kv",
        f"{args.jobs} jobs per side ({long_jobs} of ~{args.long_tokens:,} tokens, the rest short), "
        f"{args.clients} clients per side, KV cache {args.kv_blocks} x {args.block_size} tokens, "
        f"max_num_seqs {args.max_num_seqs}, max_tokens {args.max_output}",
    )
    procs, address, providers = start_stack(args, logs)
    try:
        sides = [Side(name) for name in SIDES]

        async def both() -> None:
            await asyncio.gather(*(run_side(s, docs, args, address, providers[s.name]) for s in sides))

        asyncio.run(both())
    finally:
        for proc in reversed(procs):
            proc.stop()
    print_results(sides, args)
    count, kv = sides
    numbers = {
        s.name: {
            "jobs_per_s": s.rate,
            "p50_s": percentile(s.latencies_s, 0.5),
            "p99_s": percentile(s.latencies_s, 0.99),
            "preemptions": s.preemptions,
            "errors": len(s.errors),
        }
        for s in sides
    }
    report.save(args.out, chart(sides), {"load": report.load_average(), **numbers})
    return 0 if not count.errors and not kv.errors else 1
