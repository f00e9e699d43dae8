"""A TCP fault proxy: forwards 127.0.0.1:<port> to one upstream (PostgreSQL, RabbitMQ, Redis) and
breaks the path on request.

- ``cut(seconds)``: every open connection is reset (RST: ``SO_LINGER`` 0, then close, on both
  sides) and the listener is closed, so new connections are refused, until the window ends.
- ``latency(ms, seconds)``: every chunk, either way, waits ``ms`` before it is forwarded.
- ``restore()``: ends any window at once.

The proxies of one process share an asyncio loop in a daemon thread (``ProxyThread``); the methods
above are called from any other thread and return once the change is in force.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")
CHUNK = 65536
CONNECT_TIMEOUT_SECONDS = 5.0


class ProxyThread:
    """An asyncio loop running in a daemon thread, where every proxy of this process lives."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="fault-proxy")
        self._thread.start()

    def call(self, coroutine: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop.is_running():
            # Connections still being forwarded end here, not as "Task was destroyed" at exit.
            with contextlib.suppress(Exception):
                self.call(_cancel_tasks(), timeout=5.0)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5.0)
        if not self.loop.is_running():
            self.loop.close()


async def _cancel_tasks() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@dataclass
class FaultWindow:
    """One fault a proxy acted out: what, from when to when (wall clock)."""

    kind: str  # "cut" or "latency"
    started_at: float
    ended_at: float
    detail: str = ""


@dataclass
class ProxyCounts:
    accepted: int = 0
    reset: int = 0  # connections reset by a cut
    rejected: int = 0  # accepted in the instant a cut began, and reset at once
    upstream_failures: int = 0  # the upstream itself refused or timed out


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST, not FIN: the peer sees 'connection reset', as when a server or a network dies."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Pair:
    """A client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.client, self.upstream = client, upstream
        self.done = False

    def reset(self) -> None:
        if not self.done:
            self.done = True
            _reset(self.client)
            _reset(self.upstream)

    def close(self) -> None:
        if not self.done:
            self.done = True
            self.client.close()
            self.upstream.close()


class FaultProxy:
    """Forwards ``127.0.0.1:port`` to ``upstream_host:upstream_port``, with faults set at run time."""

    def __init__(
        self,
        name: str,
        upstream_host: str,
        upstream_port: int,
        *,
        thread: ProxyThread | None = None,
        listen_host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        self.upstream = (upstream_host, upstream_port)
        self.listen_host = listen_host
        self.port = 0
        self.counts = ProxyCounts()
        self.windows: list[FaultWindow] = []
        self._own_thread = thread is None
        self._thread = thread or ProxyThread()
        self._server: asyncio.Server | None = None
        self._pairs: set[_Pair] = set()
        self._cut_until = 0.0  # loop time
        self._reopen: asyncio.TimerHandle | None = None
        self._latency_s = 0.0
        self._latency_until = 0.0
        self._current: FaultWindow | None = None

    # ------------------------------------------------------------ the interface (any thread)

    def start(self) -> int:
        """Listen on a free port (or the one this proxy had); returns the port."""
        self._thread.call(self._listen())
        return self.port

    def cut(self, seconds: float) -> None:
        """Reset every open connection and refuse new ones for ``seconds``."""
        self._thread.call(self._cut(seconds))

    def latency(self, ms: float, seconds: float) -> None:
        """Delay every forwarded chunk by ``ms`` for ``seconds``."""
        self._thread.call(self._set_latency(ms / 1000.0, seconds))

    def restore(self) -> None:
        """End any cut or latency window now."""
        self._thread.call(self._restore())

    def close(self) -> None:
        """Stop listening and close every connection (with FIN; a cut is what resets)."""
        with contextlib.suppress(RuntimeError):
            self._thread.call(self._close())
        if self._own_thread:
            self._thread.close()

    @property
    def cutting(self) -> bool:
        return self._thread.loop.time() < self._cut_until

    def open_connections(self) -> int:
        return len(self._pairs)

    def upstream_ports(self) -> set[int]:
        """The local ports of this proxy's connections to the upstream: how the upstream sees them."""
        return self._thread.call(self._upstream_ports())

    # ------------------------------------------------------------ inside the loop

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.listen_host, self.port, reuse_address=True, backlog=512
        )
        if not self.port:
            self.port = int(self._server.sockets[0].getsockname()[1])

    async def _reopen_listener(self) -> None:
        while self._server is None:
            try:
                await self._listen()
            except OSError as exc:  # someone took the port meanwhile: keep trying, say so
                log.warning("proxy %s cannot listen on %d again (%s); retrying", self.name, self.port, exc)
                await asyncio.sleep(0.1)

    def _stop_listening(self) -> None:
        if self._server is not None:
            self._server.close()  # the listening socket only; connections are handled below
            self._server = None

    async def _cut(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._cut_until = max(self._cut_until, now + seconds)
        self._stop_listening()
        for pair in list(self._pairs):
            pair.reset()
            self.counts.reset += 1
        self._pairs.clear()
        if self._reopen is not None:
            self._reopen.cancel()
        self._reopen = loop.call_at(self._cut_until, self._end_cut)
        self._open_window("cut", seconds, f"{seconds:g}s")

    def _end_cut(self) -> None:
        self._reopen = None
        self._close_window("cut")
        asyncio.get_running_loop().create_task(self._reopen_listener())

    async def _set_latency(self, delay_s: float, seconds: float) -> None:
        self._latency_s = delay_s
        self._latency_until = asyncio.get_running_loop().time() + seconds
        self._open_window("latency", seconds, f"{delay_s * 1000:g}ms")

    async def _restore(self) -> None:
        self._latency_s, self._latency_until = 0.0, 0.0
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        self._cut_until = 0.0
        if self._current is not None:
            self._close_window(self._current.kind)
        await self._reopen_listener()

    async def _close(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
        self._cut_until = float("inf")  # a pending reopen must not listen again
        self._stop_listening()
        for pair in list(self._pairs):
            pair.close()
        self._pairs.clear()

    async def _upstream_ports(self) -> set[int]:
        ports = set()
        for pair in self._pairs:
            name = pair.upstream.get_extra_info("sockname")
            if name:
                ports.add(int(name[1]))
        return ports

    def _open_window(self, kind: str, seconds: float, detail: str) -> None:
        if self._current is not None:
            self._close_window(self._current.kind)
        now = time.time()
        self._current = FaultWindow(kind, now, now + seconds, detail)
        self.windows.append(self._current)

    def _close_window(self, kind: str) -> None:
        if self._current is not None and self._current.kind == kind:
            self._current.ended_at = min(self._current.ended_at, time.time())
            self._current = None

    def _delay(self) -> float:
        loop = asyncio.get_running_loop()
        if self._latency_s and loop.time() < self._latency_until:
            return self._latency_s
        if self._latency_s:
            self._latency_s = 0.0
            self._close_window("latency")
        return 0.0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.counts.accepted += 1
        if self.cutting:  # accepted in the instant the cut began
            self.counts.rejected += 1
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), CONNECT_TIMEOUT_SECONDS
            )
        except (OSError, TimeoutError):
            self.counts.upstream_failures += 1
            _reset(writer)
            return
        if self.cutting:  # the cut began while the upstream connection was being made
            self.counts.rejected += 1
            _reset(writer)
            _reset(up_writer)
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, pair), self._pipe(up_reader, writer, pair))
        finally:
            self._pairs.discard(pair)
            pair.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pair: _Pair) -> None:
        try:
            while not pair.done:
                data = await reader.read(CHUNK)
                if not data:
                    break
                delay = self._delay()
                if delay:
                    await asyncio.sleep(delay)
                if pair.done:
                    break
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            pair.close()  # one side ended: end the other (the protocols proxied need no half-close)
