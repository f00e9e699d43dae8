"""The inference worker process (``fatura run inference-worker``): the ``ingest`` and ``run`` actors.

``ingest`` records each delivered event in the execution inbox, commits, and only then lets
Dramatiq ack the message; a requested job also gets a wake-up. A message carries one event or,
from the relay, several (services/common/event_batches.py), written together. The Dramatiq
threads' inbox writes share transactions (services/common/groupcommit.py): in a burst, one per
group instead of one per event, with one statement for the group's requested events. ``run`` is
a wake-up: it starts an execution slot and returns, so no broker delivery is held across a model
call. What happens to a message whose handling failed is the ``Redelivery`` middleware's decision
(services.common.broker): bad messages are dead-lettered with their reason, a message that met a
dependency outage comes back with backoff.

A requested job's wake-up is a slot of this process that is free now, started at once with no
message. When none is (the slots are busy, and each claims the next due job in its completion's
transaction until nothing is due), a ``run`` wake-up goes to whichever worker has a free slot, at
most one per ``FATURA_WAKE_COALESCE_SECONDS`` from this process: in a burst, one wake-up per job
was a broker message and, later, an empty claim per job. A job left without a wake-up still runs:
the busy slots reach it, and the scheduler's top-up sends wake-ups while due jobs outnumber the
queued ones. A job a slot has already claimed (the ingest often lags the slots in a burst) gets no
wake-up at all.
"""

from __future__ import annotations

import logging
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import dramatiq
from pika.exceptions import AMQPError

from services.common import deadletters, event_batches, events, faults, inbox, readiness
from services.common.broker import QuorumRabbitmqBroker, install, make_broker
from services.common.db import sync_pool
from services.common.groupcommit import GroupCommit
from services.common.messages import BadMessage, EventMessage, parse_event
from services.common.queries import load_queries
from services.common.worker import run_worker, stop_on_signals
from services.inference import metrics
from services.inference.executor import Executor
from services.inference.providers.base import Provider
from services.inference.providers.gateway import Gateway
from services.inference.settings import InferenceSettings
from services.limiter import LimiterClient

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "inference.sql")

INGEST_TYPES = frozenset({events.EXTRACTION_REQUESTED, events.EXTRACTION_CANCELLED})


class WakeUpGate:
    """At most one wake-up per interval: ``take()`` is True for the first caller of each."""

    def __init__(self, interval_seconds: float) -> None:
        self._interval = interval_seconds
        self._next = 0.0
        self._lock = threading.Lock()

    def take(self) -> bool:
        now = time.monotonic()
        with self._lock:
            if now < self._next:
                return False
            self._next = now + self._interval
            return True


def queues(prefix: str) -> tuple[str, str]:
    return events.queue_name(prefix, events.INFERENCE_INGEST), events.queue_name(prefix, events.INFERENCE_RUN)


def make_provider() -> Provider:
    return Gateway.from_settings()


def take_in(conn: Any, parsed: EventMessage) -> tuple[inbox.Received, bool]:
    """The ingest's write, inside its (group's) transaction: the event into the execution inbox,
    and whether the job it requests still waits to be claimed."""
    if parsed.event_type != events.EXTRACTION_REQUESTED:
        return inbox.take(conn, inbox.EXECUTION, parsed), False
    return inbox.take_and_check(conn, inbox.EXECUTION, parsed, Q["job_waits"])


def take_all_in(conn: Any, group: list[EventMessage]) -> list[tuple[inbox.Received, bool]]:
    """``take_in`` for a group's events: the requested ones (nearly all) in one statement."""
    if all(parsed.event_type == events.EXTRACTION_REQUESTED for parsed in group):
        return inbox.take_all_and_check(conn, inbox.EXECUTION, group, Q["job_waits"])
    return [take_in(conn, parsed) for parsed in group]


def ingest_group(pool: Any) -> GroupCommit[EventMessage, tuple[inbox.Received, bool]]:
    return GroupCommit(pool, take_in, name="execution_inbox", write_all=take_all_in)


def declare_actors(
    broker: QuorumRabbitmqBroker,
    settings: InferenceSettings,
    executor: Executor,
    group: GroupCommit[EventMessage, tuple[inbox.Received, bool]],
) -> tuple[dramatiq.Actor[Any, Any], dramatiq.Actor[Any, Any]]:
    ingest_queue, run_queue = queues(settings.common.queue_prefix)
    gate = WakeUpGate(settings.wake_coalesce_seconds)
    options: dict[str, Any] = {"broker": broker, "max_retries": 0, "time_limit": settings.time_limit_ms}

    def run() -> None:
        executor.wake()

    run_actor = dramatiq.actor(actor_name="run", queue_name=run_queue, **options)(run)

    def ingest(event: Any = None, events: Any = None, **unexpected: Any) -> None:
        if unexpected:
            raise BadMessage("malformed", f"unexpected arguments {sorted(unexpected)}")
        several = event_batches.carried(event, events)
        if several is not None:
            event_batches.take_all(broker, several, INGEST_TYPES, _write_all, _traced_taken_in)
            return
        parsed = parse_event(event, INGEST_TYPES)
        with event_batches.consuming(parsed):
            _ingest(parsed)

    def _ingest(parsed: EventMessage) -> None:
        taken = group.run(parsed)
        faults.point(settings.common.faults, faults.CRASH_AFTER_INBOX_COMMIT)
        _taken_in(parsed, taken)

    def _write_all(parsed: list[EventMessage]) -> list[tuple[inbox.Received, bool] | BaseException]:
        """A message's several events: their inbox writes queued together."""
        outcomes = group.run_many(parsed)
        faults.point(settings.common.faults, faults.CRASH_AFTER_INBOX_COMMIT)
        return outcomes

    def _traced_taken_in(parsed: EventMessage, taken: tuple[inbox.Received, bool]) -> None:
        with event_batches.consuming(parsed):
            _taken_in(parsed, taken)

    def _taken_in(parsed: EventMessage, taken: tuple[inbox.Received, bool]) -> None:
        received, waits = taken
        if received is inbox.Received.QUARANTINED:
            raise inbox.conflict(parsed)
        if waits:
            _wake(parsed)
        elif received is inbox.Received.NEW and parsed.event_type == events.EXTRACTION_REQUESTED:
            metrics.INGEST_WAKEUPS.labels("already_claimed").inc()

    def _wake(parsed: EventMessage) -> None:
        if executor.wake(wait_seconds=0):
            metrics.INGEST_WAKEUPS.labels("local").inc()
            return
        if not gate.take():
            metrics.INGEST_WAKEUPS.labels("coalesced").inc()
            return
        try:
            run_actor.send()
        except (AMQPError, dramatiq.errors.BrokerConnectionError) as exc:
            # The scheduler's top-up wakes the job anyway; losing a wake-up costs latency only.
            log.warning("could not send a wake-up for job %s: %s", parsed.job_id, exc)
            return
        metrics.INGEST_WAKEUPS.labels("sent").inc()

    ingest_actor = dramatiq.actor(actor_name="ingest", queue_name=ingest_queue, **options)(ingest)
    return ingest_actor, run_actor


def main() -> int:
    settings = InferenceSettings.from_env()
    faults.check(settings.common.faults)
    stop = threading.Event()
    stop_on_signals(stop, "inference worker")
    broker = make_broker(settings.common)
    install(broker)
    provider = make_provider()
    limiter = LimiterClient.from_settings()
    pool_size = settings.concurrency + 4
    with sync_pool(
        settings.common, name="inference", max_size=pool_size, role="worker", db_role="fatura_inference"
    ) as pool:
        broker.redelivery.dead_letter = partial(deadletters.record, pool)
        executor = Executor(settings, pool, limiter, provider)
        group = ingest_group(pool)
        declare_actors(broker, settings, executor, group)
        ready = readiness.all_of(
            readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url), limiter.readiness
        )

        def on_stop() -> None:
            group.close()
            executor.stop()
            provider.close()
            limiter.close()

        return run_worker(
            broker,
            name="inference worker",
            queues=queues(settings.common.queue_prefix),
            threads=settings.threads,
            metrics_port=settings.metrics_port,
            ready=ready,
            stop=stop,
            on_stop=on_stop,
        )
