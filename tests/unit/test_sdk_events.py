"""The SDK's event stream: the text/event-stream decoder, and automatic resumption with
Last-Event-ID against a tiny local SSE server that drops connections, goes silent and fails."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fatura_sdk import AsyncClient, Client, ServerEvent, Unauthorized
from fatura_sdk._sse import Resumption, SseDecoder

JOB = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"


def _decode(text: str) -> tuple[list[ServerEvent], SseDecoder]:
    decoder = SseDecoder()
    events = [e for line in text.split("\n") if (e := decoder.feed(line)) is not None]
    return events, decoder


def test_the_decoder_reads_ids_types_multiline_data_comments_and_retry() -> None:
    events, decoder = _decode(
        ": heartbeat\n"
        "retry: 2500\n"
        'id: 7\nevent: job\ndata: {"job_id": "a",\n'
        'data: "state": "SUCCEEDED", "state_version": 3, "done": true}\n\n'
        "data:no space\n\n"
        "id: 8\n\n"  # an id with no data dispatches nothing, but it is the last id now
        "event: job\nid: 9\ndata: partial"  # never terminated: not an event
    )
    assert [(e.id, e.event) for e in events] == [("7", "job"), ("7", "message")]
    assert events[0].json == {"job_id": "a", "state": "SUCCEEDED", "state_version": 3, "done": True}
    first = events[0]
    assert (first.job_id, first.state, first.state_version, first.done) == ("a", "SUCCEEDED", 3, True)
    assert events[1].data == "no space" and events[1].json is None and not events[1].done
    assert (decoder.comments, decoder.retry_ms, decoder.last_event_id) == (1, 2500, "9")


def test_resumption_backs_off_from_the_servers_retry_and_gives_up_after_max_reconnects() -> None:
    resume = Resumption(max_reconnects=3, server_retry_ms=1000)
    delays = [resume.next_delay() for _ in range(4)]
    assert delays[3] is None
    assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2 and 2 <= delays[2] <= 4  # type: ignore[operator]
    resume.delivered(ServerEvent("12", "job", "{}"))
    assert resume.failures == 0 and resume.headers()["Last-Event-ID"] == "12"


class _Feed:
    """What the server does on each connection, in order; records the Last-Event-ID each one sent."""

    def __init__(self, plan: list[Any]) -> None:
        self.plan = plan
        self.last_ids: list[str | None] = []
        self.paths: list[str] = []


def _event(seq: int, state: str, done: bool = False) -> str:
    data = json.dumps({"job_id": JOB, "state": state, "state_version": seq, "done": done})
    return f"id: {seq}\ndata: {data}\n\n"  # the server's job events name no type


def _snapshot(seq: int, state: str) -> str:
    job = {"job_id": JOB, "state": state, "state_version": 3, "done": state == "SUCCEEDED"}
    return f"id: {seq}\nevent: snapshot\ndata: {json.dumps({'reason': 'no_cursor', 'jobs': [job]})}\n\n"


END = 'event: end\ndata: {"type": "end", "reason": "shutdown", "message": "bye"}\n\n'


@pytest.fixture
def sse_server() -> Iterator[tuple[str, _Feed]]:
    feed = _Feed([])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            feed.last_ids.append(self.headers.get("Last-Event-ID"))
            feed.paths.append(self.path)
            step = feed.plan.pop(0) if feed.plan else ("silent", 30)
            kind = step[0]
            if kind == "status":
                body = json.dumps({"error": {"code": step[2], "message": "m"}}).encode()
                self.send_response(step[1])
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if kind == "silent":
                time.sleep(step[1])
                return
            for chunk in step[1]:
                self.wfile.write(chunk.encode())
                self.wfile.flush()
            # then the connection closes: a drop, as far as the client knows

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", feed
    server.shutdown()
    server.server_close()


def test_a_dropped_stream_resumes_from_the_last_event_it_handed_out(sse_server: tuple[str, _Feed]) -> None:
    """Given a stream that sends events 1 and 2, starts event 3 and drops, then fails with 503, then
    replays from where the client was
    When the client iterates one job's events until done
    Then it reconnects with Last-Event-ID 2 each time and sees 1, 2, 3, 4 once each."""
    url, feed = sse_server
    feed.plan = [
        (
            "events",
            ["retry: 10\n", ": heartbeat\n\n", _event(1, "READY"), _event(2, "RUNNING"), "id: 3\ndata: {"],
        ),
        ("status", 503, "unavailable"),
        ("events", [_event(3, "RUNNING"), END]),
        ("events", [": heartbeat\n\n", _event(4, "SUCCEEDED", done=True)]),
    ]
    sleeps: list[float] = []
    with Client(url, "fat_x", sleep=sleeps.append) as client:
        events = list(client.events(job_id=JOB, until_done=True))
    assert [e.id for e in events] == ["1", "2", "3", "4"] and events[-1].done
    assert feed.last_ids == [None, "2", "2", "3"]  # the end event is not handed out, nor resumed from
    assert feed.paths == [f"/v1/extraction-jobs/{JOB}/events"] * 4
    assert len(sleeps) == 3 and all(s <= 0.05 for s in sleeps)  # the server's retry: 10 ms


def test_a_job_stream_whose_snapshot_shows_the_job_done_ends_there(sse_server: tuple[str, _Feed]) -> None:
    url, feed = sse_server
    feed.plan = [("events", [_snapshot(40, "SUCCEEDED")])]
    with Client(url, "fat_x", sleep=lambda s: None) as client:
        (event,) = list(client.events(job_id=JOB, until_done=True))
    assert (event.event, event.id, event.done) == ("snapshot", "40", True)


def test_a_silent_stream_is_reconnected_after_the_read_timeout(sse_server: tuple[str, _Feed]) -> None:
    url, feed = sse_server
    feed.plan = [
        ("events", [_event(5, "RUNNING")]),
        ("silent", 2),
        ("events", [_event(6, "SUCCEEDED", True)]),
    ]
    with Client(url, "fat_x", sleep=lambda s: None) as client:
        stream = client.events(last_event_id="4", read_timeout=0.3)
        seen = [next(stream).id, next(stream).id]
        stream.close()
    assert seen == ["5", "6"] and feed.last_ids[:3] == ["4", "5", "5"] and feed.paths[0] == "/v1/events"


def test_a_refused_stream_raises_instead_of_reconnecting(sse_server: tuple[str, _Feed]) -> None:
    url, feed = sse_server
    feed.plan = [("status", 401, "unauthorized")]
    with Client(url, "fat_x", sleep=lambda s: None) as client, pytest.raises(Unauthorized):
        next(client.events())
    assert len(feed.last_ids) == 1


def test_the_async_client_resumes_the_same_way(sse_server: tuple[str, _Feed]) -> None:
    url, feed = sse_server
    feed.plan = [
        ("events", [_event(1, "RUNNING")]),
        ("events", [_event(2, "SUCCEEDED", done=True)]),
    ]

    async def nothing(_: float) -> None:
        return None

    async def run() -> list[str | None]:
        async with AsyncClient(url, "fat_x", sleep=nothing) as client:
            return [e.id async for e in client.events(job_id=JOB, until_done=True)]

    assert asyncio.run(run()) == ["1", "2"]
    assert feed.last_ids == [None, "1"]
