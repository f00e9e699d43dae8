"""The chaos suite's TCP fault proxy: a cut really resets live connections and refuses new ones for
its window, then connections work again; latency holds data back; restore ends a window early."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from services.chaos.proxy import FaultProxy


class _Echo(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        while data := self.request.recv(4096):
            self.request.sendall(data)


@pytest.fixture
def echo() -> Iterator[int]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(echo: int) -> Iterator[FaultProxy]:
    p = FaultProxy("echo", "127.0.0.1", echo)
    p.start()
    yield p
    p.close()


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def _until(condition: object, timeout: float = 30.0) -> None:
    assert callable(condition)
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.05)


def test_bytes_go_through_unchanged_both_ways(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as s:
        payload = bytes(range(256)) * 512
        s.sendall(payload)
        received = b""
        while len(received) < len(payload):
            received += s.recv(65536)
        assert received == payload


def test_a_cut_resets_a_live_connection_refuses_new_ones_then_recovers(proxy: FaultProxy) -> None:
    # Given a live connection through the proxy
    live = _connect(proxy.port)
    live.sendall(b"ping")
    assert live.recv(16) == b"ping"
    _until(lambda: proxy.open_connections() == 1)
    # When the path is cut for a window
    proxy.cut(2.0)
    # Then the live connection is reset (RST, not a clean close)
    with pytest.raises(ConnectionResetError):
        live.recv(16)
    live.close()
    # And a new connection is refused while the window lasts
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy.port)
    assert proxy.cutting
    # And once the window is over, new connections work on the same port
    _until(lambda: not proxy.cutting)

    def works() -> bool:
        try:
            with _connect(proxy.port) as s:
                s.sendall(b"back")
                return s.recv(16) == b"back"
        except OSError:
            return False

    _until(works)
    assert proxy.counts.reset == 1
    assert [w.kind for w in proxy.windows] == ["cut"]


def test_restore_ends_a_cut_early(proxy: FaultProxy) -> None:
    proxy.cut(600.0)
    with pytest.raises(ConnectionRefusedError):
        _connect(proxy.port)
    proxy.restore()
    with _connect(proxy.port) as s:
        s.sendall(b"x")
        assert s.recv(1) == b"x"
    assert proxy.windows[0].ended_at < proxy.windows[0].started_at + 600


def test_latency_holds_data_back_for_its_window_and_then_stops(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as s:
        proxy.latency(1500, seconds=600)
        s.sendall(b"slow")
        s.settimeout(0.2)
        with pytest.raises(TimeoutError):
            s.recv(16)  # held back on its way out and again on its way back
        s.settimeout(10)
        assert s.recv(16) == b"slow"
        proxy.restore()
        s.settimeout(0.5)
        s.sendall(b"fast")
        assert s.recv(16) == b"fast"
    assert [w.kind for w in proxy.windows] == ["latency"]


def test_the_proxy_knows_its_upstream_side_ports(proxy: FaultProxy) -> None:
    with _connect(proxy.port) as a, _connect(proxy.port) as b:
        for s in (a, b):
            s.sendall(b"1")
            assert s.recv(1) == b"1"
        ports = proxy.upstream_ports()
        assert len(ports) == 2
        assert not ports & {a.getsockname()[1], b.getsockname()[1], proxy.port}


def test_a_postgresql_session_through_a_cut_fails_then_a_new_one_works(database_url: str) -> None:
    real = conninfo_to_dict(database_url)
    proxy = FaultProxy("postgresql", str(real.get("host", "127.0.0.1")), int(real.get("port", 5432)))
    proxy.start()
    url = make_conninfo(database_url, host="127.0.0.1", port=str(proxy.port))
    try:
        # Given a session inside a transaction, through the proxy
        conn = psycopg.connect(url, connect_timeout=5)
        conn.execute("SELECT 1")
        # When the path is cut
        proxy.cut(2.0)
        # Then the session is gone, and a new one is refused during the window
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
        conn.close()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2).close()
        # And after the window a new session answers
        _until(lambda: not proxy.cutting)

        def answers() -> bool:
            try:
                with psycopg.connect(url, connect_timeout=2) as c:
                    return c.execute("SELECT 42").fetchone() == (42,)
            except psycopg.OperationalError:
                return False

        _until(answers)
    finally:
        proxy.close()
