"""The inference worker process (``fatura run inference-worker``): the ``ingest`` and ``run`` actors.

``ingest`` records each delivered event in the execution inbox, commits, and only then lets
Dramatiq ack the message; a requested job also gets a wake-up. ``run`` is a wake-up: it starts an
execution slot and returns, so no broker delivery is held across a model call. What happens to a
message whose handling failed is the ``Redelivery`` middleware's decision (services.common.broker):
bad messages are dead-lettered with their reason, a message that met a dependency outage comes
back with backoff.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from typing import Any

import dramatiq
from pika.exceptions import AMQPError

from services.common import deadletters, events, faults, inbox, logs, readiness, tracing
from services.common.broker import QuorumRabbitmqBroker, install, make_broker
from services.common.db import sync_pool
from services.common.messages import BadMessage, EventMessage, parse_event
from services.common.worker import run_worker, stop_on_signals
from services.inference.executor import Executor
from services.inference.providers.base import Provider
from services.inference.providers.gateway import Gateway
from services.inference.settings import InferenceSettings
from services.limiter import LimiterClient

log = logging.getLogger(__name__)

INGEST_TYPES = frozenset({events.EXTRACTION_REQUESTED, events.EXTRACTION_CANCELLED})


def queues(prefix: str) -> tuple[str, str]:
    return events.queue_name(prefix, events.INFERENCE_INGEST), events.queue_name(prefix, events.INFERENCE_RUN)


def make_provider() -> Provider:
    return Gateway.from_settings()


def declare_actors(
    broker: QuorumRabbitmqBroker, settings: InferenceSettings, pool: Any, executor: Executor
) -> tuple[dramatiq.Actor[Any, Any], dramatiq.Actor[Any, Any]]:
    ingest_queue, run_queue = queues(settings.common.queue_prefix)
    options: dict[str, Any] = {"broker": broker, "max_retries": 0, "time_limit": settings.time_limit_ms}

    def run() -> None:
        executor.wake()

    run_actor = dramatiq.actor(actor_name="run", queue_name=run_queue, **options)(run)

    def ingest(event: Any = None, **unexpected: Any) -> None:
        if unexpected:
            raise BadMessage("malformed", f"unexpected arguments {sorted(unexpected)}")
        parsed = parse_event(event, INGEST_TYPES)
        with (
            tracing.span(
                f"ingest {parsed.event_type}",
                parsed.traceparent,
                {"job_id": str(parsed.job_id), "messaging.message.id": str(parsed.event_id)},
                kind=tracing.SpanKind.CONSUMER,
            ),
            logs.bound(job_id=parsed.job_id, tenant_id=parsed.tenant_id),
        ):
            _ingest(parsed)

    def _ingest(parsed: EventMessage) -> None:
        with pool.connection() as conn, conn.transaction():
            received = inbox.take(conn, inbox.EXECUTION, parsed)
        faults.point(settings.common.faults, faults.CRASH_AFTER_INBOX_COMMIT)
        if received is inbox.Received.QUARANTINED:
            raise inbox.conflict(parsed)
        if received is inbox.Received.NEW and parsed.event_type == events.EXTRACTION_REQUESTED:
            try:
                run_actor.send()
            except (AMQPError, dramatiq.errors.BrokerConnectionError) as exc:
                # The scheduler's top-up wakes the job anyway; losing a wake-up costs latency only.
                log.warning("could not send a wake-up for job %s: %s", parsed.job_id, exc)

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
        declare_actors(broker, settings, pool, executor)
        ready = readiness.all_of(
            readiness.postgres(pool), readiness.rabbitmq(settings.common.amqp_url), limiter.readiness
        )

        def on_stop() -> None:
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
