"""The sender against a receiver in the test process: it connects to the vetted address while the
Host header keeps the registered name, and refuses what the guard refuses without connecting."""

from __future__ import annotations

import ssl
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from fix_delivery import Receiver
from services.delivery import outcomes
from services.delivery import sender as sender_module
from services.delivery.egress import EgressGuard, parse_allow
from services.delivery.outcomes import AttemptResult
from services.delivery.sender import Sender, SendLimits


def test_the_post_goes_to_the_vetted_address_with_the_registered_host_name(receiver: Receiver) -> None:
    port = receiver.url.split(":")[2].split("/")[0]
    resolved: list[str] = []

    def resolver(host: str, p: int) -> list[str]:
        resolved.append(host)
        return ["127.0.0.1"]

    sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"]), resolver), SendLimits())
    result = sender.post(f"http://erp.test:{port}/hooks?x=1", {"content-type": "application/json"}, b"{}")
    sender.close()
    assert result.status == 200 and resolved == ["erp.test"]
    assert receiver.received[0].headers["host"] == f"erp.test:{port}"
    assert receiver.received[0].body == b"{}"


def test_a_refused_target_is_never_contacted(receiver: Receiver) -> None:
    sender = Sender(EgressGuard(()), SendLimits())
    result = sender.post(receiver.url, {}, b"{}")
    assert result.status is None and result.refused and result.error_class == "egress_refused"
    assert receiver.received == []


def _ssl_failure() -> httpx.ConnectError:
    try:
        try:
            raise ssl.SSLCertVerificationError("certificate verify failed")
        except ssl.SSLError as exc:
            raise httpx.ConnectError("handshake") from exc
    except httpx.ConnectError as mapped:
        return mapped


_REQUEST = httpx.Request("POST", "http://127.0.0.1/hooks")

# Each exception a POST can raise and the error class its attempt records.
EXPECTED: list[tuple[Exception, str]] = [
    (sender_module.TotalTimeout(), "total_timeout"),
    (httpx.ConnectTimeout("x"), "connect_timeout"),
    (httpx.ReadTimeout("x"), "read_timeout"),
    (httpx.WriteTimeout("x"), "read_timeout"),
    (httpx.PoolTimeout("x"), "read_timeout"),
    (httpx.TimeoutException("x"), "read_timeout"),
    (httpx.ConnectError("x"), "connect_error"),
    (_ssl_failure(), "tls_error"),
    (httpx.ReadError("x"), "network_error"),
    (httpx.WriteError("x"), "network_error"),
    (httpx.CloseError("x"), "network_error"),
    (httpx.NetworkError("x"), "network_error"),
    (httpx.ProxyError("x"), "network_error"),
    (httpx.RemoteProtocolError("x"), "protocol_error"),
    (httpx.DecodingError("x"), "protocol_error"),
    (httpx.TooManyRedirects("x"), "protocol_error"),
    (httpx.ProtocolError("x"), "transport_error"),
    (httpx.LocalProtocolError("x"), "invalid_request"),
    (httpx.UnsupportedProtocol("x"), "invalid_url"),
    (httpx.InvalidURL("x"), "invalid_url"),
    (UnicodeEncodeError("ascii", "ü", 0, 1, "x"), "invalid_url"),
    (httpx.TransportError("x"), "transport_error"),
    (httpx.RequestError("x"), "transport_error"),
    (httpx.HTTPError("x"), "transport_error"),
    (
        httpx.HTTPStatusError("x", request=_REQUEST, response=httpx.Response(500, request=_REQUEST)),
        "transport_error",
    ),
]


@pytest.mark.parametrize(("exc", "name"), EXPECTED)
def test_transport_errors_get_names_an_operator_can_act_on(exc: Exception, name: str) -> None:
    assert isinstance(exc, sender_module.HANDLED)
    assert sender_module._error_class(exc) == name


def test_the_error_mapping_covers_every_exception_httpx_raises() -> None:
    # Like httpx's own check of its httpcore mapping: a new exception class in an httpx upgrade
    # fails here until it has a name. (Stream errors are misuse of a response, not I/O.)
    raised = {
        cls
        for cls in (getattr(httpx, name) for name in httpx.__all__)
        if isinstance(cls, type) and issubclass(cls, httpx.HTTPError | httpx.InvalidURL)
    }
    assert raised <= {type(exc) for exc, _ in EXPECTED}
    named = {name for _, name in sender_module.ERROR_CLASSES}
    assert {name for _, name in EXPECTED} <= named | {"tls_error"}


@pytest.mark.parametrize(("exc", "name"), EXPECTED)
def test_every_error_class_has_an_outcome(exc: Exception, name: str) -> None:
    # An attempt with no status is retried unless the registered URL itself cannot be sent to.
    refused = name in sender_module.PERMANENT
    decision = outcomes.decide(AttemptResult(None, name, refused=refused), 1)
    assert decision.state == ("failed" if refused else "pending")
    assert decision.reason.startswith(name)


def test_a_guard_whose_resolver_raises_still_gives_an_attempt() -> None:
    def broken(host: str, port: int) -> list[str]:
        raise OSError("resolver unreachable")

    sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"]), broken), SendLimits())
    result = sender.post("http://erp.test/hooks", {}, b"{}")
    sender.close()
    assert (result.status, result.error_class, result.refused) == (None, "dns_error", False)


def _https_receiver(tmp_path: Path, name: str) -> tuple[ThreadingHTTPServer, Path, list[dict[str, str]]]:
    """An HTTPS receiver on 127.0.0.1 whose self-signed certificate names only ``name``."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length", "0")))
            seen.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, cert, seen


def test_https_goes_to_the_vetted_address_with_the_registered_name_in_sni_and_the_certificate_check(
    tmp_path: Path,
) -> None:
    server, cert, seen = _https_receiver(tmp_path, "erp.test")
    port = server.server_address[1]
    trust = ssl.create_default_context(cafile=str(cert))
    guard = EgressGuard(parse_allow(["127.0.0.1/32"]), lambda host, p: ["127.0.0.1"])
    sender = Sender(guard, SendLimits(), verify=trust)
    try:
        # The certificate names erp.test, not 127.0.0.1: only a handshake that sent and checked the
        # registered name succeeds, although the connection went to the vetted address.
        ok = sender.post(f"https://erp.test:{port}/hooks", {}, b"{}")
        assert ok.status == 204 and seen[0]["host"] == f"erp.test:{port}"
        mismatch = sender.post(f"https://127.0.0.1:{port}/hooks", {}, b"{}")
        assert mismatch.status is None and mismatch.error_class == "tls_error"
    finally:
        sender.close()
        server.shutdown()
        server.server_close()


class _KeepAliveHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 with kept-alive connections; notes which connection (client port) each POST came on
    and when a connection ends."""

    protocol_version = "HTTP/1.1"
    seen: list[tuple[str, int]]
    ended: list[int]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.seen.append((self.headers["x-sender-thread"], self.client_address[1]))
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def handle(self) -> None:
        try:
            super().handle()
        finally:
            self.ended.append(self.client_address[1])

    def log_message(self, format: str, *args: Any) -> None:
        return


def test_each_sending_thread_keeps_its_own_connection_and_close_ends_every_one() -> None:
    seen: list[tuple[str, int]] = []
    ended: list[int] = []
    handler = type("Handler", (_KeepAliveHandler,), {"seen": seen, "ended": ended})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/hooks"
    sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"])), SendLimits())
    start = threading.Barrier(3)
    statuses: list[int | None] = []

    def send(name: str) -> None:
        start.wait()
        for _ in range(4):
            statuses.append(sender.post(url, {"x-sender-thread": name}, b"{}").status)

    threads = [threading.Thread(target=send, args=(f"t{i}",)) for i in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert statuses == [204] * 12
        ports = {name: {port for n, port in seen if n == name} for name in ("t0", "t1", "t2")}
        # Four POSTs of a thread, one kept-alive connection; no connection shared by two threads.
        assert all(len(p) == 1 for p in ports.values()), ports
        assert len(set().union(*ports.values())) == 3, ports
        assert ended == []
        sender.close()
        deadline = time.monotonic() + 10
        while len(ended) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sorted(ended) == sorted(set().union(*ports.values()))
    finally:
        sender.close()
        server.shutdown()
        server.server_close()


class _CookieSetter(BaseHTTPRequestHandler):
    """Answers every POST 200 and asks the client to keep a cookie; records the Cookie header sent."""

    seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        type(self).seen.append(self.headers.get("cookie"))
        self.send_response(200)
        self.send_header("set-cookie", f"session=tenant-{len(type(self).seen)}; Path=/")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_a_cookie_one_receiver_sets_is_never_sent_with_a_later_delivery() -> None:
    # Given a receiver that sets a cookie on every answer, registered by two endpoints on one origin
    _CookieSetter.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CookieSetter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"])), SendLimits())
    try:
        # When one endpoint's delivery, then the other's, then the first's again are sent
        for path in ("/tenant-a", "/tenant-b", "/tenant-a"):
            assert sender.post(base + path, {"content-type": "application/json"}, b"{}").status == 200
    finally:
        sender.close()
        server.shutdown()
        server.server_close()
    # Then none of them carried a cookie: a receiver's cookie is not replayed to anyone's endpoint
    assert _CookieSetter.seen == [None, None, None]
