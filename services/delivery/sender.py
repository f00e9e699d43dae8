"""One webhook POST through the egress guard: vetted address, no redirects, bounded time and bytes.

The request goes to the address the guard checked (the URL's host is replaced by it) while the
Host header and TLS SNI/certificate check keep the registered host name. A huge or slow response
cannot hold a worker: the body is read up to a cap, and a total deadline bounds every read and
write of the exchange, so a receiver trickling its status line, headers or body is cut off too.
Whatever the receiver answers becomes an ``AttemptResult``: a status, or an error class.
"""

from __future__ import annotations

import functools
import ssl
import threading
import time
import typing
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

import httpcore
import httpx

from services.delivery.egress import EgressGuard, HostNotResolved, Vetted
from services.delivery.errors import DeliveryError, EgressRefused
from services.delivery.outcomes import AttemptResult, retry_after

_MAX_TRANSPORTS = 64
_MAX_DETAIL = 500  # characters of an error's message kept with the attempt


@dataclass(frozen=True)
class SendLimits:
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = 15.0
    max_response_bytes: int = 4096


class TotalTimeout(Exception):
    """The exchange was still going at the total deadline."""


# Every error a POST can meet, most specific first, with the name an operator reads in the
# attempt log. A unit test checks that each exception httpx can raise has an entry here.
ERROR_CLASSES: tuple[tuple[type[Exception], str], ...] = (
    (TotalTimeout, "total_timeout"),
    (httpx.ConnectTimeout, "connect_timeout"),
    (httpx.ReadTimeout, "read_timeout"),
    (httpx.WriteTimeout, "read_timeout"),
    (httpx.PoolTimeout, "read_timeout"),
    (httpx.TimeoutException, "read_timeout"),
    (httpx.ConnectError, "connect_error"),  # "tls_error" when the TLS handshake failed
    (httpx.NetworkError, "network_error"),  # read, write, close
    (httpx.RemoteProtocolError, "protocol_error"),  # the receiver's answer is not valid HTTP/1.1
    (httpx.DecodingError, "protocol_error"),
    (httpx.TooManyRedirects, "protocol_error"),
    (httpx.ProxyError, "network_error"),
    # The request could not be made from the registered URL (a path or host no encoder takes).
    (httpx.LocalProtocolError, "invalid_request"),
    (httpx.UnsupportedProtocol, "invalid_url"),
    (httpx.InvalidURL, "invalid_url"),
    (UnicodeError, "invalid_url"),
    (httpx.HTTPError, "transport_error"),
)
HANDLED: tuple[type[Exception], ...] = tuple(cls for cls, _ in ERROR_CLASSES)
# The registered URL itself cannot be sent to: retrying cannot help, the delivery fails.
PERMANENT = frozenset({"invalid_url", "invalid_request"})


def _error_class(exc: Exception) -> str:
    name = next((n for cls, n in ERROR_CLASSES if isinstance(exc, cls)), type(exc).__name__)
    if name == "connect_error" and _caused_by(exc, ssl.SSLError):
        return "tls_error"
    return name


def _caused_by(exc: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = exc
    for _ in range(8):  # httpx wraps httpcore wraps the socket's error: a short chain
        if seen is None:
            return False
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Deadline(threading.local):
    """The monotonic time the current thread's exchange must end by (None outside a POST)."""

    at: float | None = None


_DEADLINE = _Deadline()


def _bounded(timeout: float | None) -> float | None:
    """``timeout`` shortened to what is left before the deadline; raises once nothing is left."""
    at = _DEADLINE.at
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise TotalTimeout
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read and write ends by the deadline, not just within a read timeout:
    one byte every few seconds resets a read timeout forever."""

    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _bounded(timeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _bounded(timeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        try:
            left = _bounded(timeout)
        except TotalTimeout:
            self._inner.close()  # as a failed handshake does: httpcore leaves closing to start_tls
            raise
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend(httpcore.SyncBackend):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        return _DeadlineStream(
            super().connect_tcp(host, port, _bounded(timeout), local_address, socket_options)
        )


class _Transport(httpx.HTTPTransport):
    """httpx's transport over the deadline backend.

    ``httpx.HTTPTransport`` takes no network backend, so this builds the same httpcore pool it
    would, with one; ``handle_request`` (and its error mapping) is httpx's own.
    """

    def __init__(self, verify: ssl.SSLContext | bool, limits: httpx.Limits) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_DeadlineBackend(),
        )


# The headers an ``httpx.Client`` would add (the sender sends through the transport itself).
_DEFAULT_HEADERS = {"accept": "*/*", "connection": "keep-alive"}


class Sender:
    """Thread-safe: one per process, shared by the worker threads.

    Each thread keeps its own kept-alive transport per origin, and sends through it without an
    ``httpx.Client``: no cookie jar (a cookie one tenant's receiver sets must not go with deliveries
    to another's endpoint on the same origin), no redirects, no proxy from the environment, and a
    third less CPU per POST. A thread sends one request at a time,
    so it never needs more than its one connection; a pool shared by the threads made them queue
    on its lock (httpcore checks every idle connection's socket under it), which took half of
    the worker threads' time in the delivery bench."""

    def __init__(self, guard: EgressGuard, limits: SendLimits, verify: ssl.SSLContext | bool = True) -> None:
        self.guard = guard
        self.limits = limits
        self._verify = verify  # the system's CAs; tests pass a context that trusts their own
        self._local = threading.local()
        self._timeout = httpx.Timeout(
            connect=limits.connect_timeout, read=limits.read_timeout, write=limits.read_timeout, pool=5.0
        ).as_dict()
        self._every: list[OrderedDict[tuple[str, str, int], _Transport]] = []  # every thread's
        self._lock = threading.Lock()

    def _transport(self, vetted: Vetted) -> _Transport:
        # One transport per registered origin: an HTTPS connection opened for one host name (SNI,
        # certificate) is never reused for another host on the same address.
        key = (vetted.target.scheme, vetted.target.host, vetted.target.port)
        transports: OrderedDict[tuple[str, str, int], _Transport] | None = getattr(
            self._local, "transports", None
        )
        if transports is None:
            transports = self._local.transports = OrderedDict()
            with self._lock:
                self._every.append(transports)
        transport = transports.get(key)
        if transport is None:
            transport = _Transport(self._verify, httpx.Limits(max_connections=2, max_keepalive_connections=1))
        with self._lock:  # close() may be clearing them
            transports[key] = transport
            transports.move_to_end(key)
            while len(transports) > _MAX_TRANSPORTS:
                transports.popitem(last=False)[1].close()
        return transport

    def close(self) -> None:
        with self._lock:
            for transports in self._every:
                for transport in transports.values():
                    transport.close()
                transports.clear()

    def post(self, url: str, headers: dict[str, str], body: bytes) -> AttemptResult:
        """POST ``body`` (the exact signed bytes) and describe what happened.

        Never raises for I/O, for the registered URL or for anything the receiver answers.
        """
        started = time.monotonic()
        try:
            vetted = self.guard.vet(url)
        except HostNotResolved as exc:
            # DNS may answer later: retried, unlike a refused address.
            return AttemptResult(
                None, "dns_error", response_body=exc.message[:_MAX_DETAIL], latency_ms=_ms(started)
            )
        except EgressRefused as exc:
            return AttemptResult(
                None, "egress_refused", response_body=exc.message[:_MAX_DETAIL], refused=True
            )
        except DeliveryError as exc:
            return AttemptResult(None, "invalid_url", response_body=exc.message[:_MAX_DETAIL], refused=True)
        deadline = started + self.limits.total_timeout
        _DEADLINE.at = deadline
        try:
            return self._exchange(vetted, headers, body, started)
        except HANDLED as exc:
            name = _error_class(exc)
            if isinstance(exc, httpx.TimeoutException) and time.monotonic() >= deadline:
                name = "total_timeout"  # the last read was cut short by the deadline
            return AttemptResult(
                None,
                name,
                response_body=str(exc)[:_MAX_DETAIL] or None,
                latency_ms=_ms(started),
                refused=name in PERMANENT,
            )
        finally:
            _DEADLINE.at = None

    def _exchange(
        self, vetted: Vetted, headers: dict[str, str], body: bytes, started: float
    ) -> AttemptResult:
        target = vetted.target
        ip = vetted.address
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        request_url = f"{target.scheme}://{host}:{target.port}{target.path}"
        extensions: dict[str, typing.Any] = {"timeout": self._timeout}
        if target.scheme == "https":
            extensions["sni_hostname"] = target.host
        request = httpx.Request(
            "POST",
            _parsed(request_url),
            content=body,
            headers={
                **_DEFAULT_HEADERS,
                **headers,
                "host": target.host_header,
                "user-agent": "fatura-webhooks/1",
                "accept-encoding": "identity",
            },
            extensions=extensions,
        )
        response = self._transport(vetted).handle_request(request)
        try:
            data = self._read_capped(response)
            status = response.status_code
            # Several fields are each a floor: the longest valid one counts; bad ones are ignored.
            wait = retry_after(response.headers.get_list("retry-after"))
        finally:
            response.close()
        return AttemptResult(
            status,
            None,
            retry_after_seconds=wait,
            response_body=data.decode("utf-8", errors="replace"),
            latency_ms=_ms(started),
        )

    def _read_capped(self, response: httpx.Response) -> bytes:
        cap = self.limits.max_response_bytes
        kept = bytearray()
        if cap == 0:
            return b""
        for chunk in response.iter_raw():
            kept += chunk[: cap - len(kept)]
            if len(kept) >= cap:
                break  # the rest is never read: closing the response drops the connection
        return bytes(kept)


@functools.lru_cache(maxsize=4096)
def _parsed(url: str) -> httpx.URL:
    """A request URL (the vetted address, so one per endpoint and address), parsed once: httpx
    parses a str on every request (8.6 µs here) and only copies a URL (0.3 µs)."""
    return httpx.URL(url)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
