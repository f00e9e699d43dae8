"""Relay wake-ups from the inference worker: many completions, one NOTIFY, and rarely a transaction.

A completion commits its outbox event; the relay should hear of it soon. A NOTIFY transaction per
completion was one more PostgreSQL transaction per job; one coalesced NOTIFY transaction per 20 ms
window was still a quarter of one per job at 150 jobs/s. Now the NOTIFY rides in a completion's own
transaction (PostgreSQL delivers it when that transaction commits) at most once per window
(``ride``): a NOTIFY inside every transaction serializes their commits, one every 20 ms does not.
A completion that did not carry one ``poke``s after its commit; a commit no carried NOTIFY has
followed two windows later gets a NOTIFY transaction from the nudge's thread, which happens when the
completions stop (the last job of a burst). A lost NOTIFY costs latency only: the
relay's periodic sweep finds the event.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from services.inference import metrics

log = logging.getLogger(__name__)

NOTIFY_OUTBOX = "NOTIFY fatura_outbox"


class RelayNudge:
    def __init__(self, pool: ConnectionPool[Any], window: float = 0.02) -> None:
        self._pool = pool
        self._window = window
        self._lock = threading.Lock()
        self._last_ride = -window  # monotonic: when a transaction last took the NOTIFY on
        # Monotonic times of the commits no NOTIFY has covered yet, oldest first. A poke is
        # recorded after its commit and a ride before its own, so a committed ride later than a
        # poke was committed after that poke's commit: the relay hears of both.
        self._uncovered: deque[float] = deque()
        self._poked = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="relay-nudge", daemon=True)
        self._thread.start()

    def ride(self, conn: psycopg.Connection[Any]) -> float | None:
        """Send the NOTIFY inside ``conn``'s open transaction unless one went out within the window.
        Returns when it did (give it to ``carried`` once the transaction committed), else None."""
        now = time.monotonic()
        with self._lock:
            if now - self._last_ride < self._window:
                return None
            self._last_ride = now
        conn.execute(NOTIFY_OUTBOX)
        return now

    def carried(self, ride: float) -> None:
        """The transaction that took the NOTIFY on at ``ride`` committed."""
        metrics.RELAY_NUDGES.labels("covered").inc(self._cover(ride))
        metrics.RELAY_NUDGES.labels("carried").inc()

    def poke(self) -> None:
        """A commit that wrote an outbox event and carried no NOTIFY."""
        with self._lock:
            self._uncovered.append(time.monotonic())
            self._poked.set()

    def close(self) -> None:
        """Send what is pending, then stop."""
        self._stopping.set()
        self._poked.set()
        self._thread.join(timeout=5.0)

    def _cover(self, upto: float) -> int:
        with self._lock:
            covered = 0
            while self._uncovered and self._uncovered[0] < upto:
                self._uncovered.popleft()
                covered += 1
            return covered

    def _loop(self) -> None:
        while True:
            self._poked.wait()
            with self._lock:
                oldest = self._uncovered[0] if self._uncovered else None
                if oldest is None:
                    self._poked.clear()
            if oldest is None:
                if self._stopping.is_set():
                    return
                continue
            # The rides of the completions after it may still cover it: the next ride comes at
            # most a window later while completions go on, and then commits.
            left = oldest + 2 * self._window - time.monotonic()
            if left > 0 and not self._stopping.is_set():
                self._stopping.wait(left)
                continue
            sent = time.monotonic()
            self._notify()  # if it failed, the relay's sweep finds them; retrying now would spin
            self._cover(sent)
            if self._stopping.is_set():
                return

    def _notify(self) -> None:
        try:
            with self._pool.connection(timeout=1.0) as conn:
                conn.execute(NOTIFY_OUTBOX)
        except (psycopg.Error, PoolTimeout) as exc:
            log.debug("could not wake the relay (its sweep will find the events): %s", exc)
            return
        metrics.RELAY_NUDGES.labels("sent").inc()
