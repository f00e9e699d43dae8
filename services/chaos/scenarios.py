"""The scenarios of ``fatura chaos run``: one fault family at a time, injected during a burst.

A scenario prepares (before the burst: processes with a fault point, an ERP that is down), then
injects its fault once the burst is flowing and returns when the fault is over, noting when, so
the runner can time the recovery. Checks that only make sense for one scenario (that the fault
was really exercised, that the limiter failed closed) are added to the common invariants.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.chaos.environment import ChaosStack, wait_until
from services.chaos.invariants import Check
from services.chaos.observe import Observer
from services.common import faults

DOOMED_COPIES = 3
# Processes the kill scenario SIGKILLs by pid, one after another, for the supervisor to restart.
KILLED = (
    "relay",
    "inference-worker-1",
    "inference-scheduler",
    "delivery-worker",
    "delivery-scheduler",
    "limiter",
)


@dataclass
class Mark:
    """A fault on the timeline (wall clock)."""

    label: str
    start: float
    end: float


@dataclass
class Context:
    stack: ChaosStack
    observer: Observer
    windows: list[Mark] = field(default_factory=list)
    kills: list[tuple[float, str]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    doomed: list[str] = field(default_factory=list)
    fault_ended_at: float | None = None
    status: str = ""  # what the live display says about the fault

    def wait_flowing(self, timeout: float = 30.0) -> None:
        """Until the first job of the burst has finished: work is then in every stage at once."""
        self.status = "waiting for the burst to flow"

        def flowing() -> bool:
            latest = self.observer.progress.latest
            return latest is not None and any(
                latest.states.get(s, 0) for s in ("SUCCEEDED", "REVIEW_REQUIRED", "FAILED_TERMINAL")
            )

        wait_until(flowing, timeout)

    def exercised(self, what: str, count: int, of: int | None = None) -> None:
        summary = f"{count}" + (f" of {of}" if of is not None else "")
        self.checks.append(Check(f"fault exercised: {what}", count > 0, count, summary))

    def end_fault(self, label: str, start: float) -> None:
        end = time.time()
        self.windows.append(Mark(label, start, end))
        self.fault_ended_at = end
        self.status = f"{label}: over"


Step = Callable[[Context], None]


def _nothing(_ctx: Context) -> None:
    return None


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    description: str
    inject: Step
    prepare: Step = _nothing


# ---------------------------------------------------------------------------------- dependency cuts


def _cut(target: str, seconds: float, fail_closed: bool = False) -> Step:
    def inject(ctx: Context) -> None:
        ctx.wait_flowing()
        proxy = ctx.stack.proxies[target]
        start = time.time()
        proxy.cut(seconds)
        ctx.status = f"{target} cut for {seconds:g} s"
        if fail_closed and seconds > 2:
            # A grant's script may have run just before the reset; half a second later, a limiter
            # without Redis must grant nothing (no emergency quota is configured).
            time.sleep(0.5)
            grants_then, calls_then = ctx.stack.limiter_grants(), ctx.stack.provider_stats()["requests_total"]
            time.sleep(max(0.0, start + seconds - 0.2 - time.time()))
            grants = ctx.stack.limiter_grants() - grants_then
            calls = int(ctx.stack.provider_stats()["requests_total"]) - int(calls_then)
            ctx.checks.append(
                Check(
                    "limiter failed closed while Redis was cut",
                    grants == 0,
                    grants,
                    f"{grants} permit(s) granted from 0.5 s into the cut to its end; "
                    f"{calls} model call(s) meanwhile (permits granted before the cut)",
                )
            )
        wait_until(lambda: not proxy.cutting, seconds + 5)
        ctx.end_fault(f"{target} cut", start)
        ctx.exercised(f"{target} connections reset by the cut", proxy.counts.reset)

    return inject


def _latency(target: str, ms: float, seconds: float) -> Step:
    def inject(ctx: Context) -> None:
        ctx.wait_flowing()
        proxy = ctx.stack.proxies[target]
        start = time.time()
        proxy.latency(ms, seconds)
        ctx.status = f"{target} +{ms:g} ms for {seconds:g} s"
        time.sleep(seconds)
        proxy.restore()
        ctx.end_fault(f"{target} +{ms:g} ms", start)
        ctx.exercised(f"{target} connections slowed", proxy.open_connections())

    return inject


def _close_broker_connections(rounds: int = 2, gap: float = 3.0) -> Step:
    def inject(ctx: Context) -> None:
        ctx.wait_flowing()
        start, closed = time.time(), 0
        for round_ in range(rounds):
            if round_:
                time.sleep(gap)
            ctx.status = f"rabbitmqctl close_connection, round {round_ + 1} of {rounds}"
            closed += ctx.stack.close_broker_connections()
        ctx.end_fault("rabbitmq connections closed", start)
        ctx.exercised("this stack's connections closed by the RabbitMQ server", closed)

    return inject


# ---------------------------------------------------------------------------------- the sandbox's faults


def _provider_fault(mode: str, seconds: float, **params: object) -> Step:
    def inject(ctx: Context) -> None:
        ctx.wait_flowing()
        start = time.time()
        ctx.stack.provider_fault(mode, **params)
        ctx.status = f"provider {mode} for {seconds:g} s"
        time.sleep(seconds)
        ctx.stack.provider_fault(None)
        ctx.end_fault(f"provider {mode}", start)
        by_outcome = ctx.stack.provider_stats().get("by_outcome", {})
        ctx.exercised(f"provider answers with {mode}", int(by_outcome.get(f"fault_{mode}", 0)))

    return inject


def _erp_down(ctx: Context) -> None:
    ctx.stack.erp_fault("down")
    ctx.windows.append(Mark("ERP down", time.time(), time.time()))


def _erp_outage(hold_after_inference: float = 5.0, limit: float = 90.0) -> Step:
    def inject(ctx: Context) -> None:
        ctx.status = "ERP down until every job has finished, and a while after"
        mark = ctx.windows.pop()
        wait_until(lambda: ctx.observer.progress.inference_done_at is not None, limit)
        time.sleep(hold_after_inference)
        ctx.stack.erp_fault(None)
        ctx.end_fault("ERP down", mark.start)
        faulted = ctx.stack.erp_stats().get("counts", {}).get("faulted", {})
        ctx.exercised("webhooks the ERP dropped", int(faulted.get("down", 0)))

    return inject


# ---------------------------------------------------------------------------------- processes


def _doomed(process: str, fault: str) -> tuple[Step, Step]:
    def prepare(ctx: Context) -> None:
        ctx.status = f"starting {DOOMED_COPIES} {process}(es) with {fault}"
        ctx.doomed = [ctx.stack.add_doomed(process, fault) for _ in range(DOOMED_COPIES)]
        assert ctx.stack.stack is not None
        ctx.stack.stack.wait_ready(timeout=60, keys=ctx.doomed)

    def inject(ctx: Context) -> None:
        stack = ctx.stack.stack
        assert stack is not None
        start, dead, fired = time.time(), set[str](), 0
        ctx.status = f"{process}es with {fault} at work"
        deadline = time.monotonic() + 90
        while len(dead) < len(ctx.doomed) and time.monotonic() < deadline:
            if ctx.observer.progress.drained_at is not None:
                break  # the work is done: a copy that never met its fault point has nothing left
            for key in ctx.doomed:
                child = stack.child(key)
                if key not in dead and not child.alive():
                    dead.add(key)
                    ctx.kills.append((time.time(), key))
                    if child.process is not None and child.process.returncode == -signal.SIGKILL:
                        fired += 1
            time.sleep(0.1)
        for key in ctx.doomed:
            if key not in dead:
                stack.kill(key, signal.SIGTERM)
        end = max([t for t, _ in ctx.kills], default=time.time())
        ctx.windows.append(Mark(f"{fault} ({fired} fired)", start, end))
        ctx.fault_ended_at = end
        ctx.exercised(f"{fault} fired (process killed by SIGKILL)", fired, len(ctx.doomed))

    return prepare, inject


def _kill_processes(ctx: Context) -> None:
    stack = ctx.stack.stack
    assert stack is not None
    ctx.wait_flowing()
    start = time.time()
    for key in KILLED:
        ctx.status = f"SIGKILL {key}"
        if stack.kill(key, signal.SIGKILL) is not None:
            ctx.kills.append((time.time(), key))
        time.sleep(1.5)
    ctx.end_fault("processes killed", start)  # the last kill; the restarts are part of the recovery
    ctx.status = "waiting for the killed processes to be back"
    back = wait_until(lambda: all(stack.is_ready(key) for key in KILLED), 60)
    restarted = sum(1 for r in stack.restarts if r.deliberate)
    ctx.exercised("processes killed by pid and restarted by the supervisor", restarted, len(KILLED))
    if not back:
        missing = [key for key in KILLED if not stack.is_ready(key)]
        ctx.checks.append(Check("killed processes ready again", False, len(missing), ", ".join(missing)))


def _doomed_scenario(name: str, process: str, fault: str, description: str) -> Scenario:
    prepare, inject = _doomed(process, fault)
    return Scenario(name, "process", description, inject, prepare)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "kill-processes",
        "process",
        "SIGKILL by pid, mid-burst: relay, an inference worker, both schedulers, the delivery worker, "
        "the limiter; the supervisor restarts each",
        _kill_processes,
    ),
    _doomed_scenario(
        "crash-after-inbox-commit",
        "inference-worker",
        faults.CRASH_AFTER_INBOX_COMMIT,
        f"{DOOMED_COPIES} extra inference workers die after the inbox commit, before the ack",
    ),
    _doomed_scenario(
        "crash-after-provider-response",
        "inference-worker",
        faults.CRASH_AFTER_PROVIDER_RESPONSE,
        f"{DOOMED_COPIES} extra inference workers die after the provider answered, before the commit",
    ),
    _doomed_scenario(
        "crash-after-webhook-post",
        "delivery-worker",
        faults.CRASH_AFTER_WEBHOOK_POST,
        f"{DOOMED_COPIES} extra delivery workers die after the ERP answered, before the outcome is recorded",
    ),
    _doomed_scenario(
        "crash-after-publish-confirm",
        "relay",
        faults.CRASH_AFTER_PUBLISH_CONFIRM,
        f"{DOOMED_COPIES} extra relays die between the publish confirm and published_at",
    ),
    Scenario("postgres-cut-8s", "postgresql", "PostgreSQL cut for 8 s (RST, refused)", _cut("postgresql", 8)),
    Scenario("postgres-cut-10s", "postgresql", "PostgreSQL cut for 10 s", _cut("postgresql", 10)),
    Scenario("postgres-cut-30s", "postgresql", "PostgreSQL cut for 30 s", _cut("postgresql", 30)),
    Scenario(
        "postgres-latency",
        "postgresql",
        "PostgreSQL 100 ms slower each way for 10 s",
        _latency("postgresql", 100, 10),
    ),
    Scenario("rabbitmq-cut-8s", "rabbitmq", "RabbitMQ cut for 8 s (RST, refused)", _cut("rabbitmq", 8)),
    Scenario("rabbitmq-cut-10s", "rabbitmq", "RabbitMQ cut for 10 s", _cut("rabbitmq", 10)),
    Scenario("rabbitmq-cut-30s", "rabbitmq", "RabbitMQ cut for 30 s", _cut("rabbitmq", 30)),
    Scenario(
        "rabbitmq-close-connections",
        "rabbitmq",
        "the RabbitMQ server force-closes this stack's connections (rabbitmqctl, picked by peer port), "
        "twice, 3 s apart",
        _close_broker_connections(),
    ),
    Scenario(
        "redis-cut-8s",
        "redis",
        "Redis cut for 8 s: the limiter fails closed, then recovers",
        _cut("redis", 8, fail_closed=True),
    ),
    Scenario("redis-cut-30s", "redis", "Redis cut for 30 s", _cut("redis", 30, fail_closed=True)),
    Scenario(
        "provider-429-storm",
        "provider",
        "the provider answers 429 (Retry-After 2) to everything for 6 s",
        _provider_fault("rate_limit_storm", 6, retry_after=2),
    ),
    Scenario(
        "provider-hang",
        "provider",
        "6 provider calls hang 20 s before headers (past the header timeout), within 10 s",
        _provider_fault("hang_before_headers", 10, delay_s=20, count=6),
    ),
    Scenario(
        "provider-broken-json",
        "provider",
        "half the provider's answers are cut in half (not JSON) for 8 s",
        _provider_fault("broken_json", 8, probability=0.5),
    ),
    Scenario(
        "erp-outage",
        "erp",
        "the ERP drops every webhook from the burst's start until 5 s after the last job finished",
        _erp_outage(),
        _erp_down,
    ),
)

SMOKE = ("crash-after-provider-response", "postgres-cut-8s", "rabbitmq-cut-8s", "redis-cut-8s")


def select(spec: str) -> list[Scenario]:
    """``all``, ``smoke``, or scenario names separated by commas; an unknown name is a ValueError."""
    by_name = {s.name: s for s in SCENARIOS}
    if spec == "all":
        return list(SCENARIOS)
    names = list(SMOKE) if spec == "smoke" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise ValueError(f"unknown scenario(s) {unknown or [spec]}; known: all, smoke, {', '.join(by_name)}")
    return [by_name[n] for n in names]
