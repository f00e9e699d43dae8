"""Run a Dramatiq worker inside a ``fatura run`` process: the queues it consumes, its ops server,
and a clean stop on SIGTERM/SIGINT.

Prefetch equals the worker's threads unless the service asks for more, so a process holds few
unacked deliveries beyond what it can work on (RabbitMQ requeues unacked deliveries only when the
connection dies or after ``consumer_timeout``). The delivery worker asks for more: most of its
wake-ups are dropped at once, and they must not queue behind the ones its threads are sending.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
from collections.abc import Callable, Collection

from dramatiq import Worker
from dramatiq.errors import BrokerConnectionError

from services.common.broker import QuorumRabbitmqBroker
from services.common.ops_server import start_ops_server
from services.common.readiness import Probe

log = logging.getLogger(__name__)


def stop_on_signals(stop: threading.Event, name: str) -> None:
    def on_signal(signum: int, frame: object) -> None:
        log.info("%s: signal %d, stopping", name, signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _declare(broker: QuorumRabbitmqBroker, queues: Collection[str], stop: threading.Event) -> bool:
    """Declare the queues, waiting for RabbitMQ with backoff if it is not there yet (a worker started
    during an outage waits instead of exiting). False when asked to stop meanwhile."""
    delay = 0.5
    while not stop.is_set():
        try:
            for queue in queues:
                broker.declare_queue(queue, ensure=True)
            return True
        except BrokerConnectionError as exc:
            log.warning(
                "RabbitMQ not reachable to declare %s (%s); retrying in %.1fs", sorted(queues), exc, delay
            )
            stop.wait(random.uniform(delay / 2, delay))
            delay = min(delay * 2, 10.0)
    return False


def run_worker(
    broker: QuorumRabbitmqBroker,
    *,
    name: str,
    queues: Collection[str],
    threads: int,
    metrics_port: int,
    ready: Probe,
    stop: threading.Event,
    on_stop: Callable[[], None] | None = None,
    worker_timeout_ms: int = 1000,
    prefetch: int | None = None,
) -> int:
    """Consume ``queues`` until ``stop`` is set; returns the process exit code.

    ``prefetch``: unacknowledged messages held per queue (default: ``threads``)."""
    ops = start_ops_server(metrics_port, ready) if metrics_port else None
    if not _declare(broker, queues, stop):
        if ops is not None:
            ops.shutdown()
        return 0
    worker = Worker(
        broker,
        queues=set(queues),
        worker_threads=threads,
        worker_timeout=worker_timeout_ms,
    )
    # Dramatiq's defaults are twice the threads (and a thousand times for delay queues, which
    # nothing here uses); set before start(), which opens the consumers.
    worker.queue_prefetch = prefetch or threads
    worker.delay_prefetch = prefetch or threads
    worker.start()
    log.info("%s: consuming %s with %d threads", name, sorted(queues), threads)
    try:
        stop.wait()
    finally:
        log.info("%s: finishing messages in hand", name)
        worker.stop(timeout=30_000)
        if on_stop is not None:
            on_stop()
        broker.close()
        if ops is not None:
            ops.shutdown()
    return 0
