"""A lean HTTP/1.1 client for the load generators: keep-alive connections to one server, each request
written in one piece, each answer parsed by httptools (llhttp, the parser uvicorn's edge uses).

The generators run on the same two cores as the server they measure, so every microsecond they
spend is taken from it. aiohttp, which they used before, builds a request object, a header
multidict, a response object and its stream for every POST; this client writes bytes prepared once
per body (only the ``Idempotency-Key`` line differs) and reads only the status line and the framing
of the answer. It speaks enough HTTP for that and no more: one request at a time per connection
(no pipelining), answers framed by ``Content-Length`` or chunked (llhttp reads both), a connection
the server or the answer asks to close is closed and replaced.

Requests rotate over the open connections, the one idle longest first, as the requests of many
clients would spread over theirs. A pool that takes its most recently used connection (aiohttp's,
and this one at first) sends nearly everything over the few connections a light load keeps busy,
and the edge's worker processes each accepted some of them: in one run one worker did 14 times the
other's work, and the edge measured as one process.

Used as::

    client = HttpClient("127.0.0.1", 8080, limit=64)
    await client.connect_all()                                                   # optional
    status = await client.request(prefix, b"Idempotency-Key: k-1\\r\\n", body)   # raises on errors
    client.close()
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import cast
from urllib.parse import urlsplit

import httptools


class HttpClient:
    """At most ``limit`` keep-alive connections to ``host:port``; a request waits for a free one."""

    def __init__(self, host: str, port: int, *, limit: int) -> None:
        self._host, self._port, self._limit = host, port, limit
        # Oldest first: requests rotate over every open connection, as many clients' requests would.
        self._idle: deque[_Connection] = deque()
        self._open = 0  # connections open or being opened
        self._waiting: deque[asyncio.Future[_Connection | None]] = deque()

    async def request(self, prefix: bytes, headers: bytes, body: bytes) -> int:
        """Send ``prefix`` (request and header lines, CRLF-terminated), ``headers`` (more such
        lines), a ``Content-Length`` and ``body``; return the answer's status once it has been read
        whole. A connection error propagates (``OSError``, ``httptools.HttpParserError``)."""
        conn = await self._acquire()
        reuse = False
        try:
            status, reuse = await conn.exchange(
                b"".join((prefix, headers, b"Content-Length: %d\r\n\r\n" % len(body), body))
            )
            return status
        finally:
            self._release(conn, reuse)

    async def connect_all(self) -> None:
        """Open every connection of ``limit`` now (a run then starts with them all, as many clients
        connected before it would), each one idle until a request takes it."""
        conns = await asyncio.gather(*(self._acquire() for _ in range(self._limit - self._open)))
        for conn in conns:
            self._pass_on(conn)

    def close(self) -> None:
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.popleft()
            if not conn.closed:
                return conn
            self._open -= 1
        if self._open >= self._limit:
            waiter: asyncio.Future[_Connection | None] = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            try:
                handed = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    # Handed a connection (or a slot) just as it was cancelled: give it back.
                    self._pass_on(waiter.result())
                raise
            if handed is not None:
                return handed
        else:
            self._open += 1
        # A slot of ``limit`` is ours: open a connection in it.
        try:
            _, conn = await asyncio.get_running_loop().create_connection(_Connection, self._host, self._port)
        except BaseException:
            self._pass_on(None)
            raise
        return conn

    def _release(self, conn: _Connection, reuse: bool) -> None:
        if reuse and not conn.closed:
            self._pass_on(conn)
        else:
            conn.close()
            self._pass_on(None)

    def _pass_on(self, conn: _Connection | None) -> None:
        """A connection (or, as None, the slot of one that was closed) goes to the first request
        waiting, or back to the idle list (or the slot is freed)."""
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is None:
            self._open -= 1
        else:
            self._idle.append(conn)


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one exchange at a time."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._answer: asyncio.Future[tuple[int, bool]] | None = None
        self.closed = False

    async def exchange(self, request: bytes) -> tuple[int, bool]:
        """Write ``request``; the answer's status and whether the connection may be used again."""
        if self.closed or self._transport is None:
            raise ConnectionResetError("the connection was closed")
        self._answer = asyncio.get_running_loop().create_future()
        self._transport.write(request)
        try:
            return await self._answer
        finally:
            self._answer = None

    def close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    # httptools callback
    def on_message_complete(self) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_result((self._parser.get_status_code(), self._parser.should_keep_alive()))

    def _fail(self, exc: BaseException) -> None:
        answer = self._answer
        if answer is not None and not answer.done():
            answer.set_exception(exc)


def request_prefix(url: str, headers: dict[str, str]) -> tuple[str, int, bytes]:
    """``url``'s host, port and the request's first lines: a POST of its path with ``headers``."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"the load generators speak plain HTTP to a host: {url!r}")
    port = parts.port or 80
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    lines = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return parts.hostname, port, ("\r\n".join(lines) + "\r\n").encode("latin-1")
