"""``fatura bench quota``: how much of a rate-limited provider's capacity the workers use, beside the
capacity formula of seed 000 (section 3, "Backpressure ve rate limiting"):

    attempt_capacity = min(RPM / 60,
                           TPM_budget / (60 * reserved_tokens),
                           concurrency / mean_inference_seconds)

The simulated provider enforces RPM, concurrency and a latency distribution of its own, and by
default quantizes its limits per second as OpenAI documents ("60,000 requests/minute may be
enforced as 1,000 requests/second"; ``FATURA_SANDBOX_PROVIDER_PER_SECOND``). The limiter's pool is
given the same limits; three worker processes share the pool through the limiter. The run measures
each limiter in turn on a fresh stack: ``window`` (the pool's window may be spent at once) and
``gcra`` (the pool paced, one request every window_ms / RPM ms). For each: once the workers are
ready the provider's counters are reset, a backlog larger than the run can drain is accepted at
once, the counters are read every half second for the duration, and an interactive job of a
second tenant arrives mid-minute; its start delay is how long it waited for its first provider
call. Goals (issues 4 and 14): >= 95% of the formula, no 429 for the provider's own limits, every
5 s window after the warm-up within 20% of the formula, the interactive job started within 2 s.
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from bench import report
from bench.report import load_average
from bench.stack import Stack, add_stack_arguments, limiter_toml

SEED_FORMULA = (
    "seed 000_d29c5a52d58f6ad8.txt §3: attempt_capacity = min(RPM / 60, "
    "TPM_budget / (60 * reserved_tokens), concurrency / mean_inference_seconds)"
)
GOAL_RATIO = 0.95
GOAL_BAND = 0.20  # every 5 s window after the warm-up within this share of the formula
GOAL_START_S = 2.0  # the interactive job's first provider call, after its acceptance
RATE_WINDOW_S = 5.0
LIMITERS = ("window", "gcra")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_stack_arguments(p, "fatura_bench_quota")
    p.add_argument(
        "--duration",
        type=float,
        default=180.0,
        help="measured seconds per limiter (default 180); a multiple of the 60 s RPM window, or the "
        "ratio is skewed",
    )
    p.add_argument("--rpm", type=int, default=600, help="provider RPM and the limiter pool's (default 600)")
    p.add_argument("--tpm", type=int, default=0, help="provider TPM and the pool's; 0 = unlimited (default)")
    p.add_argument("--concurrency", type=int, default=20, help="provider concurrency = pool max_in_flight")
    p.add_argument("--latency-ms", type=float, default=1000.0, help="provider mean latency (default 1000)")
    p.add_argument(
        "--distribution", default="exponential", choices=("fixed", "exponential", "lognormal"), help="latency"
    )
    p.add_argument(
        "--pool-window-ms",
        type=int,
        default=61_000,
        help="the limiter pool's RPM window (default 61000, as deploy/local/limiter.toml ships it: a "
        "second of margin over the provider's minute; 60000 reproduces the 429s of an equal window)",
    )
    p.add_argument(
        "--limiters",
        default=",".join(LIMITERS),
        help="the pool pacings measured, in this order (default window,gcra)",
    )
    p.add_argument(
        "--burst-seconds",
        type=float,
        default=None,
        help="the gcra pool's burst_seconds (0-1; default: the pool's own, 0.5)",
    )
    p.add_argument(
        "--no-per-second",
        dest="per_second",
        action="store_false",
        help="the provider enforces only its minute (FATURA_SANDBOX_PROVIDER_PER_SECOND=0)",
    )
    p.add_argument(
        "--interactive-at",
        type=float,
        default=40.0,
        help="seconds into the run when the interactive job arrives (default 40: mid-minute, when a "
        "window limiter has spent its minute)",
    )
    p.add_argument(
        "--initial-backlog",
        type=int,
        default=0,
        help="jobs accepted when the window opens, the rest of the backlog at twice the formula's "
        "rate (default 0: the whole backlog at once); accepting, relaying and ingesting ~2,000 jobs "
        "at once stalls every process of a 2-core machine for seconds, the simulated provider too",
    )
    p.add_argument(
        "--warm-up", type=float, default=10.0, help="seconds left out of the 5 s windows (default 10)"
    )
    p.add_argument(
        "--scheduler-interval",
        type=float,
        default=0.0,
        help="FATURA_SCHEDULER_INTERVAL_SECONDS of the inference scheduler (default: its own, 1 s); a "
        "worker that a pool-wide denial closed waits for the scheduler's next wake-up",
    )
    p.add_argument("--workers", type=int, default=3, help="inference worker processes (default 3)")
    p.add_argument("--slots", type=int, default=8, help="FATURA_INFERENCE_CONCURRENCY of each worker")
    report.add_out_argument(p, "bench-quota.png")


@dataclass
class Samples:
    at: list[float] = field(default_factory=list)  # seconds since the window opened
    admitted: list[int] = field(default_factory=list)  # cumulative requests the provider admitted
    limited: list[int] = field(default_factory=list)  # cumulative 429s for its own limits
    in_flight: list[int] = field(default_factory=list)


def capacity(
    rpm: int, tpm: int, reserved_tokens: float, concurrency: int, mean_seconds: float
) -> dict[str, float]:
    """The seed's three terms and their minimum, in attempts/s; an unlimited dimension is infinite."""
    terms = {
        "rpm_term": rpm / 60 if rpm else math.inf,
        "tpm_term": tpm / (60 * reserved_tokens) if tpm else math.inf,
        "concurrency_term": concurrency / mean_seconds if concurrency and mean_seconds > 0 else math.inf,
    }
    return {**terms, "capacity": min(terms.values())}


def admitted(stats: dict[str, Any]) -> int:
    return sum(n for outcome, n in stats["by_outcome"].items() if not outcome.startswith("limited_"))


def limited(stats: dict[str, Any]) -> int:
    return sum(n for outcome, n in stats["by_outcome"].items() if outcome.startswith("limited_"))


def windows(samples: Samples, start: float, width: float = RATE_WINDOW_S) -> list[tuple[float, float]]:
    """Attempts/s in consecutive windows of ``width`` seconds from ``start``: (window start, rate),
    each between the first samples at or after its ends; a window the samples do not cover is left
    out."""
    rates: list[tuple[float, float]] = []
    at = start
    while True:
        i = next((k for k, t in enumerate(samples.at) if t >= at), None)
        j = next((k for k, t in enumerate(samples.at) if t >= at + width), None)
        if i is None or j is None or j == i:
            return rates
        rates.append((at, (samples.admitted[j] - samples.admitted[i]) / (samples.at[j] - samples.at[i])))
        at += width


def sample(stack: Stack, label: str, duration: float, samples: Samples, stop: threading.Event) -> None:
    started = time.monotonic()
    next_print = 10.0
    while not stop.is_set():
        elapsed = time.monotonic() - started
        stats = stack.provider_stats()
        samples.at.append(elapsed)
        samples.admitted.append(admitted(stats))
        samples.limited.append(limited(stats))
        samples.in_flight.append(int(stats["in_flight"]))
        if elapsed >= next_print:
            print(
                f"  {label}: {elapsed:5.0f}/{duration:g} s: {samples.admitted[-1]} attempts "
                f"({samples.admitted[-1] / elapsed:5.2f}/s), in flight {stats['in_flight']}, peak "
                f"{stats['peak_in_flight']}, 429s {samples.limited[-1]}",
                flush=True,
            )
            next_print += 10.0
        if elapsed >= duration:
            return
        stop.wait(0.5)


def run(args: argparse.Namespace) -> int:
    limiters = [name.strip() for name in args.limiters.split(",") if name.strip()]
    if not limiters or any(name not in LIMITERS for name in limiters):
        raise SystemExit(f"--limiters takes a comma-separated list of {', '.join(LIMITERS)}")
    if args.burst_seconds is not None and not 0 <= args.burst_seconds <= 1:
        raise SystemExit("--burst-seconds must be from 0 to 1")
    rate = args.rpm / 60 if args.rpm else args.concurrency / (args.latency_ms / 1000)
    backlog = int(rate * args.duration * 1.3) + 300
    feeding = (
        f" ({args.initial_backlog} at once, the rest at twice the formula's rate)"
        if args.initial_backlog
        else ""
    )
    report.header(
        "quota",
        f"provider RPM {args.rpm}, TPM {args.tpm or 'unlimited'}, concurrency {args.concurrency}, latency "
        f"{args.distribution} mean {args.latency_ms:g} ms, "
        f"{'quantized per second' if args.per_second else 'per minute only'}; limiter pool the same over "
        f"{args.pool_window_ms} ms, pacing {' then '.join(limiters)} (gcra burst "
        f"{'default' if args.burst_seconds is None else f'{args.burst_seconds:g} s'}); "
        f"{args.workers} workers x {args.slots} slots; scheduler interval "
        f"{f'{args.scheduler_interval:g} s' if args.scheduler_interval else 'default'}; "
        f"{args.duration:g} s measured each; backlog {backlog} jobs{feeding}; an interactive job at "
        f"{args.interactive_at:g} s",
    )
    runs = {name: measure(args, name, backlog, rate) for name in limiters}
    print_results(runs, args)
    fig = chart(runs, args)
    numbers = {
        name: {
            **{k: v for k, v in figures.items() if k != "samples_data"},
            "samples": asdict(figures["samples_data"]),
        }
        for name, figures in runs.items()
    }
    report.save(args.out, fig, numbers)
    return 0


def measure(args: argparse.Namespace, pacing: str, backlog: int, rate: float) -> dict[str, Any]:
    """One limiter on a stack of its own: the figures of its run, and its samples."""
    pool_tpm = args.tpm or 10**12  # the limiter needs a number; far above anything reachable
    with Stack(f"quota-{pacing}", args.database, limiter_deadline_ms=args.limiter_deadline_ms) as stack:
        stack.start_limiter(
            limiter_toml(
                rpm=args.rpm,
                tpm=pool_tpm,
                max_in_flight=args.concurrency,
                tenant_max_in_flight=args.concurrency,
                window_ms=args.pool_window_ms,
                pacing=pacing,
                burst_seconds=args.burst_seconds if pacing == "gcra" else None,
            )
        )
        stack.start_provider(
            rpm=args.rpm,
            tpm=args.tpm,
            concurrency=args.concurrency,
            latency_ms=args.latency_ms,
            distribution=args.distribution,
            per_second=args.per_second,
        )
        stack.start_relay()
        scheduler = {"FATURA_SCHEDULER_INTERVAL_SECONDS": str(args.scheduler_interval)}
        stack.start_scheduler(**(scheduler if args.scheduler_interval else {}))
        tenant, _ = stack.make_tenant("quota", max_in_flight=10_000)
        interactive_tenant, _ = stack.make_tenant("quota-interactive", max_in_flight=10)
        env = {"FATURA_INFERENCE_CONCURRENCY": str(args.slots)}
        for _ in range(args.workers):
            stack.start_worker(**env)
        # The window opens on an idle provider with empty windows, and the backlog arrives at once:
        # what the run measures is the whole ramp, no warm-up it cannot see.
        stack.reset_provider_stats()
        load = load_average()
        print(
            f"{pacing}: {args.workers} workers ready; window opens, accepting {backlog} jobs "
            f"(load average {load})",
            flush=True,
        )
        samples, stop = Samples(), threading.Event()
        sampler = threading.Thread(
            target=sample, args=(stack, pacing, args.duration, samples, stop), daemon=True
        )
        opened = time.monotonic()
        sampler.start()
        interactive = None
        try:
            initial = min(backlog, args.initial_backlog or backlog)
            stack.accept_jobs(tenant, initial)
            print(f"  {pacing}: accepted {initial} jobs", flush=True)
            accepted, chunk = initial, 50
            while sampler.is_alive() and (
                accepted < backlog or (interactive is None and args.interactive_at < args.duration)
            ):
                now = time.monotonic() - opened
                if interactive is None and args.interactive_at < args.duration and now >= args.interactive_at:
                    interactive = stack.accept_jobs(
                        interactive_tenant, 1, priority="interactive", connections=1
                    )[0]
                    print(f"  {pacing}: an interactive job arrives at {now:.1f} s", flush=True)
                # The rest of the backlog at twice the formula's rate, 50 jobs at a time.
                if accepted < backlog and now >= (accepted - initial) / (2 * rate):
                    n = min(chunk, backlog - accepted)
                    stack.accept_jobs(tenant, n, connections=1)
                    accepted += n
                    continue
                time.sleep(0.05)
            sampler.join()
        except KeyboardInterrupt:
            stop.set()
            sampler.join()
        final = stack.provider_stats()
        counters = stack.worker_counters()
        attempts = stack.query("attempt_figures", tenant_id=tenant)[0]
        states = dict(stack.tenant_states(tenant))
        first = stack.query("first_call", job_id=interactive) if interactive else []
    span = samples.at[-1] if samples.at else 0.0
    estimated = float(attempts["estimated_tokens"] or 0.0)
    reserved = estimated + 2048  # FATURA_MAX_OUTPUT_TOKENS, the worker's default
    measured_latency = float(attempts["mean_latency_ms"] or 0.0) / 1000
    formula = capacity(args.rpm, args.tpm, reserved, args.concurrency, args.latency_ms / 1000)
    achieved = samples.admitted[-1] / span if span else 0.0
    rates = windows(samples, args.warm_up)
    low, high = (1 - GOAL_BAND) * formula["capacity"], (1 + GOAL_BAND) * formula["capacity"]
    return {
        "pacing": pacing,
        "load_average": load,
        "load_average_end": load_average(),
        "seconds": span,
        "attempts": samples.admitted[-1] if samples.admitted else 0,
        "attempts_per_second": achieved,
        "formula": formula,
        "formula_with_measured_latency": capacity(
            args.rpm, args.tpm, reserved, args.concurrency, measured_latency
        ),
        "ratio": achieved / formula["capacity"],
        "provider_429s": samples.limited[-1] if samples.limited else 0,
        "provider_by_outcome": final["by_outcome"],
        "peak_in_flight": final["peak_in_flight"],
        "mean_provider_latency_ms": measured_latency * 1000,
        "reserved_tokens": reserved,
        "windows_5s": [{"from_s": at, "attempts_per_second": r} for at, r in rates],
        "windows_within_band": sum(low <= r <= high for _, r in rates),
        "interactive_start_s": first[0]["seconds"] if first else None,
        "interactive_first_outcome": f"{first[0]['outcome']} {first[0]['http_status']}" if first else None,
        "job_states": states,
        "worker_counters": counters,
        "samples_data": samples,
    }


def print_results(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> None:
    print()
    print(SEED_FORMULA)
    for name, figures in runs.items():
        f = figures["formula"]
        print(
            f"\n{name} limiter (load average {figures['load_average']} at the start, "
            f"{figures['load_average_end']} at the end):"
        )
        print(
            f"  formula = min({_term(f['rpm_term'])}, {_term(f['tpm_term'])}, "
            f"{_term(f['concurrency_term'])}) "
            f"= {f['capacity']:.3f} attempts/s  (RPM {args.rpm}, TPM {args.tpm or 'unlimited'}, reserved "
            f"{figures['reserved_tokens']:.0f} tokens, concurrency {args.concurrency}, "
            f"mean {args.latency_ms:g} ms;"
            f" with the measured mean latency {figures['mean_provider_latency_ms']:.0f} ms: "
            f"{figures['formula_with_measured_latency']['capacity']:.3f})"
        )
        ratio = figures["ratio"]
        print(
            f"  achieved: {figures['attempts']} attempts in {figures['seconds']:.1f} s = "
            f"{figures['attempts_per_second']:.3f} attempts/s = {100 * ratio:.1f}% of the formula "
            f"(goal >= {100 * GOAL_RATIO:.0f}%: {report.met(ratio >= GOAL_RATIO)})"
        )
        limited_total = figures["provider_429s"]
        print(
            f"  provider 429s for its own limits: {limited_total} "
            f"(goal 0: {report.met(limited_total == 0)}); "
            f"by outcome {figures['provider_by_outcome']}"
        )
        rates = figures["windows_5s"]
        within = figures["windows_within_band"]
        shown = " ".join(f"{w['attempts_per_second']:.1f}" for w in rates)
        print(
            f"  attempts/s per {RATE_WINDOW_S:g} s window after {args.warm_up:g} s: {shown}"
            f"\n    {within} of {len(rates)} within ±{100 * GOAL_BAND:.0f}% of the formula "
            f"(goal all: {report.met(bool(rates) and within == len(rates))})"
        )
        start = figures["interactive_start_s"]
        if start is None:
            print(
                f"  interactive job at {args.interactive_at:g} s: no provider call by the end (goal "
                f"<= {GOAL_START_S:g} s: NOT met)"
            )
        else:
            print(
                f"  interactive job at {args.interactive_at:g} s: first provider call {start:.2f} s after "
                f"acceptance ({figures['interactive_first_outcome']}) (goal <= {GOAL_START_S:g} s: "
                f"{report.met(start <= GOAL_START_S)})"
            )
        peak = figures["peak_in_flight"]
        print(
            f"  peak in-flight at the provider: {peak} (goal <= {args.concurrency}: "
            f"{report.met(peak <= args.concurrency)})"
        )
        print(f"  job states at the end: {figures['job_states']}")
        print(
            "  worker counters: " + ", ".join(f"{k} {v:.0f}" for k, v in figures["worker_counters"].items())
        )
        if args.duration % 60:
            print(f"  note: {args.duration:g} s is not whole minutes of the RPM window; the ratio is skewed")


def _term(value: float) -> str:
    return "∞" if math.isinf(value) else f"{value:.3f}"


def chart(runs: dict[str, dict[str, Any]], args: argparse.Namespace) -> Any:
    """The limiters side by side: attempts/s over time against the formula and its band, then the
    provider's 429s and the requests in flight."""
    plt = report.pyplot()
    fig, axes = plt.subplots(2, len(runs), figsize=(7 * len(runs), 7), sharex=True, squeeze=False)
    for column, (name, figures) in enumerate(runs.items()):
        samples: Samples = figures["samples_data"]
        rate_ax, limit_ax = axes[0][column], axes[1][column]
        capacity_now = figures["formula"]["capacity"]
        times, per_second = [], []
        for i in range(1, len(samples.at)):
            j = next(k for k in range(i + 1) if samples.at[k] >= samples.at[i] - 1.0)
            if samples.at[i] > samples.at[j]:
                times.append(samples.at[i])
                per_second.append(
                    (samples.admitted[i] - samples.admitted[j]) / (samples.at[i] - samples.at[j])
                )
        rate_ax.plot(times, per_second, color="tab:blue", alpha=0.35, label="attempts/s (1 s)")
        rates = figures["windows_5s"]
        rate_ax.step(
            [w["from_s"] for w in rates],
            [w["attempts_per_second"] for w in rates],
            where="post",
            color="tab:blue",
            label=f"attempts/s ({RATE_WINDOW_S:g} s windows)",
        )
        rate_ax.axhline(capacity_now, color="green", linestyle="--", label="seed formula")
        rate_ax.axhspan(
            (1 - GOAL_BAND) * capacity_now, (1 + GOAL_BAND) * capacity_now, color="green", alpha=0.08
        )
        if figures["interactive_start_s"] is not None:
            rate_ax.axvline(args.interactive_at, color="purple", linestyle=":", label="interactive job")
        rate_ax.set(
            ylabel="attempts/s",
            title=f"{name}: {100 * figures['ratio']:.1f}% of the formula, 429s {figures['provider_429s']}, "
            f"interactive start {_seconds(figures['interactive_start_s'])}",
        )
        rate_ax.legend(loc="upper right", fontsize="small")
        rate_ax.grid(True, alpha=0.3)
        limit_ax.plot(samples.at, samples.limited, color="red", label="provider 429s (cumulative)")
        limit_ax.plot(samples.at, samples.in_flight, color="tab:orange", label="in flight at the provider")
        limit_ax.set(xlabel="seconds", ylabel="requests")
        limit_ax.legend(loc="upper left", fontsize="small")
        limit_ax.grid(True, alpha=0.3)
    fig.suptitle(
        f"fatura bench quota: RPM {args.rpm}, {args.concurrency} in flight, {args.latency_ms:g} ms calls, "
        f"provider {'quantized per second' if args.per_second else 'per minute'}; load average "
        + " / ".join(f["load_average"] for f in runs.values())
    )
    return fig


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f} s"
