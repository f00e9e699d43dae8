"""One webhook POST through the egress guard: vetted address, no redirects, bounded time and bytes.

The request goes to the address the guard checked (the URL's host is replaced by it) while the
Host header and TLS SNI/certificate check keep the registered host name. A huge or slow response
cannot hold a worker: the body is read up to a cap, and a total deadline covers a trickling reply.
"""

from __future__ import annotations

import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import httpx

from services.delivery.egress import EgressGuard, Vetted
from services.delivery.errors import DeliveryError, EgressRefused
from services.delivery.outcomes import AttemptResult, parse_retry_after

_MAX_CLIENTS = 64


@dataclass(frozen=True)
class SendLimits:
    connect_timeout: float = 5.0
    read_timeout: float = 10.0
    total_timeout: float = 15.0
    max_response_bytes: int = 4096


def _error_class(exc: Exception) -> str:
    # Names an operator can act on; the mapping is checked by a unit test.
    if isinstance(exc, httpx.ConnectTimeout):
        return "connect_timeout"
    if isinstance(exc, httpx.ReadTimeout | httpx.WriteTimeout | httpx.PoolTimeout):
        return "read_timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect_error"
    if isinstance(exc, httpx.RemoteProtocolError):
        return "protocol_error"
    if isinstance(exc, httpx.NetworkError):
        return "network_error"
    return type(exc).__name__


class TotalTimeout(Exception):
    """The response kept arriving past the total deadline."""


class Sender:
    """Thread-safe: one per process, shared by the worker threads."""

    def __init__(self, guard: EgressGuard, limits: SendLimits, verify: ssl.SSLContext | bool = True) -> None:
        self.guard = guard
        self.limits = limits
        self._verify = verify  # the system's CAs; tests pass a context that trusts their own
        self._clients: OrderedDict[tuple[str, str, int], httpx.Client] = OrderedDict()
        self._lock = threading.Lock()

    def _client(self, vetted: Vetted) -> httpx.Client:
        # One pooled client per registered origin: an HTTPS connection opened for one host name
        # (SNI, certificate) is never reused for another host on the same address.
        key = (vetted.target.scheme, vetted.target.host, vetted.target.port)
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                lim = self.limits
                client = httpx.Client(
                    verify=self._verify,
                    follow_redirects=False,
                    trust_env=False,
                    timeout=httpx.Timeout(
                        connect=lim.connect_timeout, read=lim.read_timeout, write=lim.read_timeout, pool=5.0
                    ),
                    limits=httpx.Limits(max_connections=32, max_keepalive_connections=16),
                )
                self._clients[key] = client
                while len(self._clients) > _MAX_CLIENTS:
                    self._clients.popitem(last=False)[1].close()
            self._clients.move_to_end(key)
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                client.close()
            self._clients.clear()

    def post(self, url: str, headers: dict[str, str], body: bytes) -> AttemptResult:
        """POST ``body`` (the exact signed bytes) and describe what happened; never raises for I/O."""
        started = time.monotonic()
        try:
            vetted = self.guard.vet(url)
        except EgressRefused as exc:
            return AttemptResult(None, "egress_refused", response_body=exc.message[:500], refused=True)
        except DeliveryError as exc:
            return AttemptResult(None, "invalid_url", response_body=exc.message[:500], refused=True)
        target = vetted.target
        ip = vetted.address
        host = f"[{ip}]" if ip.version == 6 else str(ip)
        request_url = f"{target.scheme}://{host}:{target.port}{target.path}"
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        client = self._client(vetted)
        try:
            request = client.build_request(
                "POST",
                request_url,
                content=body,
                headers={
                    **headers,
                    "host": target.host_header,
                    "user-agent": "fatura-webhooks/1",
                    "accept-encoding": "identity",
                },
                extensions=extensions,
            )
            response = client.send(request, stream=True)
            try:
                data = self._read_capped(response, started)
                status = response.status_code
                retry_after = parse_retry_after(response.headers.get("retry-after"))
            finally:
                response.close()
        except httpx.HTTPError as exc:
            return AttemptResult(None, _error_class(exc), latency_ms=_ms(started))
        except TotalTimeout:
            return AttemptResult(None, "total_timeout", latency_ms=_ms(started))
        return AttemptResult(
            status,
            None,
            retry_after_seconds=retry_after,
            response_body=data.decode("utf-8", errors="replace"),
            latency_ms=_ms(started),
        )

    def _read_capped(self, response: httpx.Response, started: float) -> bytes:
        cap = self.limits.max_response_bytes
        kept = bytearray()
        for chunk in response.iter_raw():
            if time.monotonic() - started > self.limits.total_timeout:
                raise TotalTimeout
            kept += chunk[: cap - len(kept)]
            if len(kept) >= cap:
                break  # the rest is never read: closing the response drops the connection
        return bytes(kept)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
