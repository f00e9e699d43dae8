"""The one way the stack, the benches and the tests start a child, wait for it and stop it."""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from services.common.procs import ChildProcess, NotReady, accepts, answers, free_port, status, stop_all

# A child that serves /readyz (200) and /other (404) on the port it is given, and ignores SIGTERM
# when asked to, so that stopping it has to fall back to SIGKILL.
SERVER = """
import http.server, signal, sys
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/readyz" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
print("serving", flush=True)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def _server(tmp_path: Path, port: int, mode: str = "polite") -> ChildProcess:
    command = [sys.executable, "-c", SERVER, str(port), mode]
    return ChildProcess.start("server", command, log_path=tmp_path / "logs" / "server.log")


def test_a_free_port_is_one_nobody_listens_on() -> None:
    port = free_port()
    assert not accepts(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert accepts(port)


def test_with_a_port_range_free_ports_come_from_it_and_not_twice_in_a_row(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # Given a range of 9 ports, one of them held by a server
        lo = taken - 4
        monkeypatch.setenv("FATURA_PORT_RANGE", f"{lo}-{lo + 8}")
        # When the process asks for four
        got = [free_port() for _ in range(4)]
        # Then they are of the range, all different, never the one held
        assert len(set(got)) == 4, got
        assert all(lo <= port <= lo + 8 for port in got) and taken not in got
        # And a range holding only ports in use gives none
        monkeypatch.setenv("FATURA_PORT_RANGE", f"{taken}-{taken}")
        with pytest.raises(RuntimeError, match="no free port found"):
            free_port()
    monkeypatch.setenv("FATURA_PORT_RANGE", "9000")
    with pytest.raises(ValueError, match="FATURA_PORT_RANGE must be LO-HI"):
        free_port()


def test_a_child_is_ready_when_its_url_answers_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    with _server(tmp_path, port) as child:
        url = f"http://127.0.0.1:{port}"
        assert child.wait_ready(f"{url}/readyz", timeout=20) is child
        assert answers(f"{url}/readyz") and status(f"{url}/other") == 404
        assert child.wait_accepting(port, timeout=1) is child
        assert child.stop(grace=10) == -signal.SIGTERM
    assert not child.alive()
    assert status(f"{url}/readyz") == 0
    assert "serving" in child.log_tail()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    port = free_port()
    child = _server(tmp_path, port, "stubborn").wait_accepting(port, timeout=20)
    started = time.monotonic()
    assert child.stop(grace=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 10


def test_a_child_that_exits_before_it_is_ready_says_so_with_its_log(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('no database'); raise SystemExit(3)"]
    child = ChildProcess.start("broken", command, log_path=tmp_path / "broken.log")
    with pytest.raises(NotReady, match=r"(?s)broken exited with code 3.*no database"):
        child.wait_ready(f"http://127.0.0.1:{free_port()}/readyz", timeout=20)


def test_a_child_that_never_answers_is_not_ready_in_time(tmp_path: Path) -> None:
    child = ChildProcess.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with pytest.raises(NotReady, match=r"sleeper was not ready at .* within 0\.3s"):
            child.wait_ready(f"http://127.0.0.1:{free_port()}/readyz", timeout=0.3)
    finally:
        assert child.stop(grace=5) == -signal.SIGTERM


# A child that, on SIGTERM, writes its mark and drains until every sibling's mark is there too (as
# a service drains its work), exiting 0; after 5 s of waiting for them it gives up with 3. Stopped
# one at a time, the first would wait for siblings nobody has told to stop yet.
DRAINER = """
import os, signal, sys, time
marks, me, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
def drain(*_):
    open(os.path.join(marks, me), "w").close()
    give_up = time.monotonic() + 5
    while len(os.listdir(marks)) < count:
        if time.monotonic() > give_up:
            os._exit(3)
        time.sleep(0.05)
    os._exit(0)
signal.signal(signal.SIGTERM, drain)
print("draining on SIGTERM", flush=True)
while True:
    time.sleep(1)
"""


def test_children_stopped_together_are_all_told_before_any_is_waited_for(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    # Given three children that drain on SIGTERM until all three were told to stop
    command = [sys.executable, "-c", DRAINER, str(marks)]
    children = [
        ChildProcess.start(f"drainer-{i}", [*command, str(i), "3"], log_path=tmp_path / f"drainer-{i}.log")
        for i in range(3)
    ]
    stubborn_port = free_port()
    stubborn = _server(tmp_path, stubborn_port, "stubborn").wait_accepting(stubborn_port, timeout=20)
    for child in children:
        child.wait_until(lambda c=child: "draining on SIGTERM" in c.log(), "listening for SIGTERM", 20)
    # When they are stopped together, with one that ignores SIGTERM among them
    stop_all([*children, stubborn], grace=8)
    # Then each drainer saw every sibling told to stop and exited 0; the stubborn one was killed
    assert [child.wait_exit(timeout=1) for child in children] == [0, 0, 0]
    assert sorted(p.name for p in marks.iterdir()) == ["0", "1", "2"]
    assert stubborn.wait_exit(timeout=1) == -signal.SIGKILL
