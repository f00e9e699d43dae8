"""Cancelling a provider call that nobody owns any more.

When a worker loses its lease (the reaper gave the job to someone else, or the tenant cancelled
it), the call it has in flight must stop: its answer would be refused as stale, and while it runs
it holds a limiter permit and a provider slot (DESIGN §5.4, §5.5). httpx has no cancel for a blocking
call, so the gateway's client reads and writes through ``TrackingBackend``: while a thread is
inside ``CallScope.active()``, every socket it touches is attached to that scope, and ``cancel()``
shuts the socket down from any thread. The blocked read returns at once with an error, and the
gateway reports the hop as ``cancelled`` (not a channel failure: no breaker count, no failover).

A socket is attached only while its thread is inside the scope, and detached before the response
is closed (which hands the connection back to the pool), so a cancel can never reach a connection
that another call has taken from the pool since.
"""

from __future__ import annotations

import socket
import ssl
import threading
import typing

import httpcore
import httpx

_current = threading.local()


class CallScope:
    """One owned provider call; ``cancel()`` may come from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancelled = False
        self._streams: list[httpcore.NetworkStream] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            streams, self._streams = self._streams, []
        for stream in streams:
            _shutdown(stream)

    def active(self) -> Attachment:
        """Attach the sockets this thread uses to this scope until the block ends."""
        return Attachment(self)

    def _attach(self, stream: httpcore.NetworkStream) -> None:
        with self._lock:
            if self._cancelled:
                cancelled = True
            else:
                cancelled = False
                if stream not in self._streams:
                    self._streams.append(stream)
        if cancelled:
            _shutdown(stream)


class Attachment:
    """While entered, the sockets this thread touches are attached to ``scope`` (to none when it is
    None); ``close()``, or the end of the block, lets them go. A class rather than a generator
    context manager in an ExitStack: it is entered once per hop, and costs a third as much."""

    __slots__ = ("_previous", "_scope")

    def __init__(self, scope: CallScope | None) -> None:
        self._scope = scope
        self._previous: CallScope | None = None

    def __enter__(self) -> Attachment:
        if self._scope is not None:
            self._previous = getattr(_current, "scope", None)
            _current.scope = self._scope
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Let go of the sockets now (a second call does nothing)."""
        scope, self._scope = self._scope, None
        if scope is not None:
            _current.scope = self._previous
            with scope._lock:
                scope._streams = []


def _shutdown(stream: httpcore.NetworkStream) -> None:
    sock = stream.get_extra_info("socket")
    if sock is None:
        return
    try:
        # The base method on purpose: SSLSocket.shutdown would also drop its SSL object under the
        # reading thread.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed


class _TrackedStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def _touch(self) -> None:
        scope: CallScope | None = getattr(_current, "scope", None)
        if scope is not None:
            scope._attach(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._touch()
        return self._inner.read(max_bytes, timeout)

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._touch()
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        self._touch()
        return _TrackedStream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class TrackingBackend(httpcore.NetworkBackend):
    """httpcore's blocking network backend, with every stream attachable to a ``CallScope``."""

    def __init__(self, inner: httpcore.NetworkBackend | None = None) -> None:
        self._inner = inner or httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        tracked = _TrackedStream(stream)
        tracked._touch()
        return tracked

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        return _TrackedStream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def cancellable_transport(**kwargs: typing.Any) -> httpx.HTTPTransport:
    """An ``httpx.HTTPTransport`` whose connections go through ``TrackingBackend``.

    httpx does not take a network backend, so the pool it built is given one after the fact (the
    gateway's test of a call whose job the worker lost, tests/integration/test_gateway.py, fails if
    a new httpx stops honouring this).
    """
    transport = httpx.HTTPTransport(**kwargs)
    pool = transport._pool
    pool._network_backend = TrackingBackend(pool._network_backend)
    return transport
