"""Coalesced relay wake-ups from the inference worker: many completions, one NOTIFY.

A completion commits its outbox event; the relay should hear of it soon, but a NOTIFY per
completion is one more PostgreSQL transaction per job. The worker's slots ``poke`` instead, and one
thread sends a single ``NOTIFY`` for every poke of a window (the blocking twin of the edge's
``OutboxNotifier``). A lost NOTIFY costs latency only: the relay's periodic sweep finds the event.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

log = logging.getLogger(__name__)

NOTIFY_OUTBOX = "NOTIFY fatura_outbox"


class RelayNudge:
    def __init__(self, pool: ConnectionPool[Any], window: float = 0.02) -> None:
        self._pool = pool
        self._window = window
        self._poked = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="relay-nudge", daemon=True)
        self._thread.start()

    def poke(self) -> None:
        self._poked.set()

    def close(self) -> None:
        """Send what is pending, then stop."""
        self._stopping.set()
        self._poked.set()
        self._thread.join(timeout=5.0)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._poked.wait()
            # Completions landing during the window share this NOTIFY.
            self._stopping.wait(self._window)
            self._poked.clear()
            self._notify()

    def _notify(self) -> None:
        try:
            with self._pool.connection(timeout=1.0) as conn:
                conn.execute(NOTIFY_OUTBOX)
        except (psycopg.Error, PoolTimeout) as exc:
            log.debug("could not wake the relay (its sweep will find the events): %s", exc)
