"""The two ends of ``fatura bench events`` that are not the edge: processes that each hold hundreds of
SSE connections and note when every job event arrives, and the ceiling, a bare fan-out server that
writes each event to every connection within 10 ms of being told of it.

A client speaks HTTP/1.1 (the body chunked, as uvicorn streams it) over a plain asyncio protocol on
uvloop, and keeps, per connection, the seq of each job event (a frame with an ``id:`` and no
``event:`` line) and the ``time.monotonic()`` of the read that brought it; the snapshot that opens a
stream marks the connection ready. Every time here is ``time.monotonic()``, one clock for every
process on Linux.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import socket
import threading
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection as MpConnection
from multiprocessing.sharedctypes import Synchronized
from typing import Any, cast

# The bare server writes what arrived within this window at once (the edge's feed reads at least
# every FATURA_EVENT_POLL_SECONDS, sooner when a commit notifies it).
BARE_BATCH_SECONDS = 0.01
# What the bare server sends for an event: the size and shape of the edge's job event frame.
_BODY = (
    b'{"seq":%d,"job_id":"01a22b15-3596-715b-805f-e7647f49c5a8","state":"RUNNING","state_version":2,'
    b'"kind":"state","at":"2026-11-02T10:15:04.113000+00:00","done":false,'
    b'"status_url":"/v1/extraction-jobs/01a22b15-3596-715b-805f-e7647f49c5a8"}'
)


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str
    api_key: str

    def request(self) -> bytes:
        return (
            f"GET {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Authorization: Bearer {self.api_key}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()


class _Stream(asyncio.Protocol):
    def __init__(self, request: bytes, on_ready: Any, received: Synchronized[int]) -> None:
        self.request = request
        self.on_ready = on_ready
        self.received = received
        self.buffer = b""  # the stream's text not yet cut into frames
        self.raw = b""  # bytes not yet taken out of their chunk
        self.chunk_left = 0
        self.crlf_left = 0
        self.in_body = False
        self.ready = False
        self.status = 0
        self.seqs: array[int] = array("q")
        self.times: array[float] = array("d")
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        cast(asyncio.Transport, transport).write(self.request)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        raw = self.raw + data
        if not self.in_body:
            end = raw.find(b"\r\n\r\n")
            if end < 0:
                self.raw = raw
                return
            self.status = int(raw.split(b" ", 2)[1])
            self.in_body, raw = True, raw[end + 4 :]
        buffer = self.buffer + self._dechunk(raw)
        pos = 0
        events = 0
        while (end := buffer.find(b"\n\n", pos)) >= 0:
            if buffer.startswith(b"id: ", pos):
                line = buffer.find(b"\n", pos)
                if buffer.startswith(b"data:", line + 1):
                    self.seqs.append(int(buffer[pos + 4 : line]))
                    self.times.append(now)
                    events += 1
                elif not self.ready:  # the snapshot
                    self.ready = True
                    self.on_ready()
            pos = end + 2
        self.buffer = buffer[pos:]
        if events:
            with self.received.get_lock():
                self.received.value += events

    def _dechunk(self, raw: bytes) -> bytes:
        """The payload of the chunks in ``raw``; an incomplete size line waits for the next read."""
        out, pos = [], 0
        while pos < len(raw):
            if self.crlf_left:
                step = min(self.crlf_left, len(raw) - pos)
                pos, self.crlf_left = pos + step, self.crlf_left - step
            elif self.chunk_left:
                step = min(self.chunk_left, len(raw) - pos)
                out.append(raw[pos : pos + step])
                pos, self.chunk_left = pos + step, self.chunk_left - step
                if not self.chunk_left:
                    self.crlf_left = 2
            else:
                line = raw.find(b"\r\n", pos)
                if line < 0:
                    break
                self.chunk_left = int(raw[pos:line].split(b";")[0], 16)
                pos = line + 2
                if not self.chunk_left:  # the last chunk: the stream ended
                    pos = len(raw)
        self.raw = raw[pos:]
        return b"".join(out)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def client_process(
    target: Target,
    connections: int,
    ready: Synchronized[int],
    received: Synchronized[int],
    pipe: MpConnection,
) -> None:
    """Open ``connections`` streams, count them ready and their events received, and send back, when
    the parent says so, every stream's (seqs, times) and its HTTP status."""
    import uvloop

    async def main() -> list[tuple[int, bytes, bytes]]:
        loop = asyncio.get_running_loop()
        request = target.request()

        def one_ready() -> None:
            with ready.get_lock():
                ready.value += 1

        streams = []
        for _ in range(connections):
            _, stream = await loop.create_connection(
                lambda: _Stream(request, one_ready, received), target.host, target.port
            )
            streams.append(stream)
        await loop.run_in_executor(None, pipe.recv)  # the parent's "stop"
        return [(s.status, s.seqs.tobytes(), s.times.tobytes()) for s in streams]

    pipe.send(uvloop.run(main()))
    pipe.close()


@dataclass
class Clients:
    """The client processes of one phase: SSE streams (``client_process`` here) or, given another
    ``run`` with the same arguments, JobService Watch streams (``bench/watch_clients.py``)."""

    processes: list[mp.process.BaseProcess]
    pipes: list[MpConnection]
    ready: Synchronized[int]
    received: Synchronized[int]

    @classmethod
    def start(
        cls, target: Any, subscribers: int, processes: int, run: Callable[..., None] | None = None
    ) -> Clients:
        run = run or client_process
        context = mp.get_context("spawn")
        ready, received = context.Value("q", 0), context.Value("q", 0)
        procs, pipes = [], []
        shares = [subscribers // processes + (i < subscribers % processes) for i in range(processes)]
        for share in shares:
            parent, child = context.Pipe()
            proc = context.Process(target=run, args=(target, share, ready, received, child))
            proc.start()
            procs.append(proc)
            pipes.append(parent)
        return cls(procs, pipes, ready, received)

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.processes if p.pid is not None}

    def wait_ready(self, subscribers: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.ready.value < subscribers:
            if time.monotonic() > deadline or not all(p.is_alive() for p in self.processes):
                raise SystemExit(f"only {self.ready.value} of {subscribers} streams opened")
            time.sleep(0.1)

    def collect(self) -> list[tuple[int, array[int], array[float]]]:
        """Stop the clients and return each stream's (status, seqs, receive times)."""
        streams: list[tuple[int, array[int], array[float]]] = []
        for pipe in self.pipes:
            pipe.send("stop")
        for pipe, proc in zip(self.pipes, self.processes, strict=True):
            for status, seqs, times in pipe.recv():
                s, t = array("q"), array("d")
                s.frombytes(seqs)
                t.frombytes(times)
                streams.append((status, s, t))
            proc.join(timeout=30)
        return streams


# ---------------------------------------------------------------- the ceiling: a bare fan-out


def bare_server(port: int, feed_port: int, started: Any) -> None:
    """Serve ``port``: every connection gets the SSE preamble and a snapshot frame, then every event;
    on ``feed_port`` the writer sends ``<number>\\n`` after each commit, and each number goes out
    within ``BARE_BATCH_SECONDS``, as the frame of an event of the edge's size, to every connection."""
    import uvloop

    streams: set[asyncio.Transport] = set()

    class Subscriber(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = cast(asyncio.Transport, transport)
            self.seen = b""

        def data_received(self, data: bytes) -> None:
            self.seen += data
            if b"\r\n\r\n" in self.seen and self.transport not in streams:
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                    + _chunk(b"retry: 2000\n\nid: 0\nevent: snapshot\ndata: {}\n\n")
                )
                streams.add(self.transport)

        def connection_lost(self, exc: Exception | None) -> None:
            streams.discard(self.transport)

    pending: list[bytes] = []

    def flush() -> None:
        frames = _chunk(b"".join(pending))
        pending.clear()
        for transport in streams:
            transport.write(frames)

    class Feed(asyncio.Protocol):
        """Numbers that arrive within ``BARE_BATCH_SECONDS`` of each other go out in one write to
        each connection: one syscall per connection per batch, not per event."""

        def __init__(self) -> None:
            self.buffer = b""

        def data_received(self, data: bytes) -> None:
            lines = (self.buffer + data).split(b"\n")
            self.buffer = lines.pop()
            frames = [b"id: %d\ndata: %s\n\n" % (int(n), _BODY % int(n)) for n in lines if n]
            if frames and not pending:
                asyncio.get_running_loop().call_later(BARE_BATCH_SECONDS, flush)
            pending.extend(frames)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        await loop.create_server(Subscriber, "127.0.0.1", port, backlog=4096)
        await loop.create_server(Feed, "127.0.0.1", feed_port)
        started.set()
        await asyncio.Event().wait()

    uvloop.run(main())


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class BareServer:
    """The ceiling's server in a process of its own, and the writer's line to it."""

    def __init__(self) -> None:
        from services.common.procs import free_port

        self.port, feed_port = free_port(), free_port()
        context = mp.get_context("spawn")
        started = context.Event()
        self.process = context.Process(target=bare_server, args=(self.port, feed_port, started), daemon=True)
        self.process.start()
        if not started.wait(30):
            raise SystemExit("the bare fan-out server did not start")
        self._feed = socket.create_connection(("127.0.0.1", feed_port))
        self._feed.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._lock = threading.Lock()  # the writer's threads share the line

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def publish(self, number: int) -> None:
        with self._lock:
            self._feed.sendall(b"%d\n" % number)

    def close(self) -> None:
        self._feed.close()
        self.process.terminate()
        self.process.join(timeout=10)


def rss_bytes(pids: set[int]) -> int:
    """Resident memory of these processes, summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total
