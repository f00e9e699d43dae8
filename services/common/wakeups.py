"""Wake-up messages handed over by many threads and published together by one.

A wake-up only says "look at the database now": the database re-drives anything a lost one would
strand (the schedulers' sweeps, DESIGN §5.12). So nobody waits for its confirm, and the messages
the threads hand over while a batch is on the wire leave together in the next one
(``QuorumRabbitmqBroker.publish_all``: one confirm round trip per batch instead of per message).
A batch RabbitMQ does not take, or cannot be reached for, is logged and counted, not retried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

import dramatiq
from dramatiq.errors import BrokerConnectionError
from prometheus_client import Counter

from services.common.broker import QuorumRabbitmqBroker

log = logging.getLogger(__name__)

WAKEUPS_PUBLISHED = Counter(
    "fatura_wakeups_published_total",
    "Wake-up messages handed to the background publisher, by result (taken: RabbitMQ confirmed it; "
    "lost: not taken or not reached, the database re-drives it)",
    ["queue", "result"],
)
MAX_BATCH = 256
# An idle publisher answers the connection's heartbeats this often.
_IDLE_SECONDS = 10.0


class WakeupPublisher:
    """Thread-safe. ``send`` returns at once; ``close`` publishes what is still queued."""

    def __init__(self, broker: QuorumRabbitmqBroker, name: str) -> None:
        self._broker = broker
        self._name = name
        self._queue: list[dramatiq.Message[Any]] = []
        self._lock = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    def send(self, messages: Sequence[dramatiq.Message[Any]]) -> None:
        if not messages:
            return
        with self._lock:
            closing = self._closing
            if not closing:
                self._queue.extend(messages)
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                self._lock.notify()
        if closing:
            # Stopping: published here (outside the lock), as the caller would have done itself.
            self._publish(list(messages))

    def close(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    if not self._lock.wait(_IDLE_SECONDS):
                        self._broker.keep_alive()
                if not self._queue:
                    return  # closing, and everything was sent
                batch = self._queue[:MAX_BATCH]
                del self._queue[:MAX_BATCH]
            self._publish(batch)

    def _publish(self, batch: list[dramatiq.Message[Any]]) -> None:
        try:
            taken = self._broker.publish_all(batch)
        except BrokerConnectionError as exc:
            taken = [False] * len(batch)
            log.warning("could not publish %d wake-ups (%s); the database re-drives them", len(batch), exc)
        except Exception:
            taken = [False] * len(batch)
            log.exception("publishing %d wake-ups failed; the database re-drives them", len(batch))
        for message, ok in zip(batch, taken, strict=True):
            WAKEUPS_PUBLISHED.labels(message.queue_name, "taken" if ok else "lost").inc()
