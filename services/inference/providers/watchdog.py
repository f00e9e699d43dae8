"""Ends a streamed response when its attempt's deadline passes, from one thread per process.

httpx has no total timeout: its read timeout bounds each socket read, so a stream that trickles a
byte every few seconds would outlive any deadline. The watchdog shuts down the response's socket
at the deadline (``network_stream`` is a documented httpx response extension); the blocked read
returns at once with an error the caller reads as the deadline.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from typing import Any


class Alarm:
    def __init__(self, when: float, response: Any) -> None:
        self.when = when
        self.fired = False
        self._response = response
        self._cancelled = False
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            self._response = None

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def fire(self) -> None:
        with self._lock:
            if self._cancelled or self._response is None:
                return
            self.fired = True
            stream = self._response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is None:
                return
            try:
                # The base method on purpose: SSLSocket.shutdown would also drop its SSL object under
                # the reading thread.
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass  # already closed


class Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Alarm]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, when: float, response: Any) -> Alarm:
        """Shut ``response``'s socket at ``when`` (``time.monotonic()``) unless cancelled first."""
        alarm = Alarm(when, response)
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="provider-watchdog", daemon=True)
                self._thread.start()
            heapq.heappush(self._heap, (when, next(self._seq), alarm))
            if self._heap[0][2] is alarm:
                self._cond.notify()
        return alarm

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                alarm = heapq.heappop(self._heap)[2]
            alarm.fire()
