"""Whatever a webhook receiver answers, the delivery records an attempt with an outcome.

Each receiver here is a real TCP server on 127.0.0.1 writing the exact bytes of its answer (a bad
``Retry-After``, a NUL in the body, a status line no parser takes, a body that never ends...). The
delivery goes the worker's way: claim, sign, POST, decide, record in PostgreSQL; the test reads
the attempt log an operator would read.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from fix_db import MakeTenant, SyncPool
from fix_delivery import KEYRING, insert_secret
from services.delivery import outcomes, signing, store
from services.delivery.egress import EgressGuard, Resolver, parse_allow, system_resolver
from services.delivery.sender import Sender, SendLimits
from services.delivery.settings import DeliverySettings

SETTINGS = DeliverySettings(lease_seconds=30.0, keyring=KEYRING)
# The deadline is short so that a trickling receiver is cut off soon; a read timeout longer than
# the trickle's one byte per second shows that the deadline, not the read timeout, ends it.
LIMITS = SendLimits(connect_timeout=2.0, read_timeout=5.0, total_timeout=2.5, max_response_bytes=4096)
Answer = Callable[[socket.socket, threading.Event], None]


def raw(data: bytes) -> Answer:
    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(data)

    return answer


def trickle(head: bytes, slow: bytes) -> Answer:
    """``head`` at once, then ``slow`` one byte per second."""

    def answer(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        for byte in slow:
            if stop.wait(1.0):
                return
            conn.sendall(bytes([byte]))

    return answer


@dataclass
class RawReceiver:
    """A TCP server that reads each request in full and answers with the bytes ``answer`` writes,
    then closes the connection."""

    answer: Answer
    requests: list[bytes] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = int(self.sock.getsockname()[1])
        self._start(self._serve)

    def url(self, host: str = "127.0.0.1", path: str = "/hooks") -> str:
        return f"http://{host}:{self.port}{path}"

    def _start(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self.threads.append(thread)
        thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._start(self._handle, conn)

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5.0)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(body) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    body += chunk
                self.requests.append(head + b"\r\n\r\n" + body)
                self.answer(conn, self.stop)
            except OSError:
                return  # the sender hung up (a cut-off body): what this receiver is for

    def host_header(self, index: int = 0) -> str:
        for line in self.requests[index].split(b"\r\n"):
            if line.lower().startswith(b"host:"):
                return line.split(b":", 1)[1].strip().decode()
        raise AssertionError("the request had no Host header")

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
        for thread in self.threads:
            thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Answer], RawReceiver]]:
    started: list[RawReceiver] = []

    def start(answer: Answer) -> RawReceiver:
        receiver = RawReceiver(answer)
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.close()


@pytest.fixture
def make_sender() -> Iterator[Callable[..., Sender]]:
    made: list[Sender] = []

    def make(resolver: Resolver = system_resolver, limits: SendLimits = LIMITS) -> Sender:
        sender = Sender(EgressGuard(parse_allow(["127.0.0.1/32"]), resolver), limits)
        made.append(sender)
        return sender

    yield make
    for sender in made:
        sender.close()


@dataclass
class Recorded:
    """What the attempt log and the delivery say after one attempt."""

    outcome: str
    http_status: int | None
    error_class: str | None
    response_body: str | None
    retry_after_ms: int | None
    delivery_state: str
    reason: str


@pytest.fixture
def deliver(pool: SyncPool, make_tenant: MakeTenant) -> Callable[[Sender, str], Recorded]:
    tenant_id = make_tenant().id

    def attempt(sender: Sender, url: str) -> Recorded:
        endpoint_id, secret = uuid.uuid4(), signing.new_secret()
        delivery_id = signing.delivery_id(uuid.uuid4(), endpoint_id)
        with pool.connection() as conn:
            conn.execute(
                """INSERT INTO webhook_endpoints (id, tenant_id, url, event_types)
                   VALUES (%s, %s, %s, '{extraction.completed.v1}')""",
                (endpoint_id, tenant_id, url),
            )
            insert_secret(conn, endpoint_id, secret)
            conn.execute(
                """INSERT INTO deliveries (delivery_id, event_id, event_type, endpoint_id, tenant_id, body)
                   VALUES (%s, %s, 'extraction.completed.v1', %s, %s, '{"ok":1}'::bytea)""",
                (delivery_id, uuid.uuid4(), endpoint_id, tenant_id),
            )
        # The worker's deliver step
        claim = store.claim(pool, delivery_id, SETTINGS)
        assert claim is not None
        headers = signing.headers(claim.secrets, str(claim.delivery_id), int(time.time()), claim.body)
        result = sender.post(claim.url, headers, claim.body)
        decision = outcomes.decide(result, claim.round_attempt, scale=SETTINGS.retry_scale)
        assert store.record(pool, claim, result, decision, SETTINGS)
        with pool.connection() as conn:
            row = conn.execute(
                """SELECT a.outcome, a.http_status, a.error_class, a.response_body, a.retry_after_ms,
                          d.state, d.reason
                   FROM delivery_attempts a JOIN deliveries d USING (delivery_id)
                   WHERE a.delivery_id = %s""",
                (delivery_id,),
            ).fetchall()
        assert len(row) == 1, row
        with pool.connection() as conn:
            # A retried one is due again later: no other module's scheduler may wake it then, when
            # its receiver's port may be another test's (the database is shared).
            conn.execute(
                "UPDATE deliveries SET next_attempt_at = 'infinity'"
                " WHERE delivery_id = %s AND state = 'pending'",
                (delivery_id,),
            )
        r = row[0]
        return Recorded(
            r["outcome"],
            r["http_status"],
            r["error_class"],
            r["response_body"],
            r["retry_after_ms"],
            r["state"],
            r["reason"],
        )

    return attempt


Deliver = Callable[[Sender, str], Recorded]
Serve = Callable[[Answer], RawReceiver]
MakeSender = Callable[..., Sender]


def _answer_429(*retry_after: bytes) -> Answer:
    fields = b"".join(b"retry-after: " + value + b"\r\n" for value in retry_after)
    return raw(b"HTTP/1.1 429 Too Many Requests\r\n" + fields + b"content-length: 0\r\n\r\n")


# --- Retry-After ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "\uff13\uff10".encode(),  # fullwidth digits "30"
        "٣٠".encode(),  # Arabic-Indic digits
        "²".encode(),  # a digit to str.isdigit(), not to float()
        b"-5",
        b"1e30",
        b"1.5",
        b"soon",
        b"",
        b"Fri, 31 Dec 99999999999 23:59:59 GMT",  # a year no datetime holds
        b"Mon, 30 Nov 2026 08:00:42 +99999999999999999999",
    ],
)
def test_a_retry_after_that_is_not_ascii_seconds_or_a_date_is_ignored(
    serve: Serve, make_sender: MakeSender, deliver: Deliver, value: bytes
) -> None:
    receiver = serve(_answer_429(value))
    recorded = deliver(make_sender(), receiver.url())
    # Then the 429 is recorded and retried on the normal schedule
    assert (recorded.outcome, recorded.http_status, recorded.error_class) == ("pending", 429, None)
    assert recorded.retry_after_ms is None


@pytest.mark.parametrize(
    ("values", "expected_ms"),
    [
        ([b"9" * 400], 86_400_000),  # capped at a day
        ([b"Thu, 01 Jan 1970 00:00:00 GMT"], 0),  # in the past: now
        ([b"Fri, 31 Dec 9999 23:59:59 GMT"], 86_400_000),  # far in the future: capped
        ([b"30", b"120"], 120_000),  # several fields: each is a floor, the longest counts
        ([b"30", "٣٠٠".encode()], 30_000),  # a bad one among them is ignored
    ],
)
def test_a_retry_after_is_honoured_within_a_day(
    serve: Serve, make_sender: MakeSender, deliver: Deliver, values: Sequence[bytes], expected_ms: int
) -> None:
    receiver = serve(_answer_429(*values))
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.http_status) == ("pending", 429)
    assert recorded.retry_after_ms == expected_ms


def test_a_retry_after_date_a_minute_ahead_is_read_as_about_a_minute(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    at = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    receiver = serve(_answer_429(at.encode()))
    recorded = deliver(make_sender(), receiver.url())
    assert recorded.retry_after_ms is not None and 30_000 <= recorded.retry_after_ms <= 60_000


# --- Bodies --------------------------------------------------------------------------------


def _answer(status: bytes, body: bytes, *headers: bytes) -> Answer:
    extra = b"".join(h + b"\r\n" for h in headers)
    return raw(
        b"HTTP/1.1 "
        + status
        + b"\r\n"
        + extra
        + b"content-length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def test_a_nul_and_invalid_utf8_in_the_body_are_stored_as_replacement_characters(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    receiver = serve(_answer(b"500 Internal Server Error", b"broken\x00here \xff\xfe end"))
    recorded = deliver(make_sender(), receiver.url())
    # PostgreSQL's text refuses NUL: the attempt is still recorded, with U+FFFD in its place
    assert (recorded.outcome, recorded.http_status) == ("pending", 500)
    assert recorded.response_body == "broken\ufffdhere \ufffd\ufffd end"


def test_a_body_with_encoded_surrogates_is_stored_as_replacement_characters(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    # A lone surrogate written as UTF-8 bytes (CESU-8 / WTF-8), which strict UTF-8 does not allow
    receiver = serve(_answer(b"400 Bad Request", b"bad \xed\xa0\x80 and \xed\xb2\xa9 too"))
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.http_status) == ("failed", 400)
    assert recorded.response_body is not None and "\ufffd" in recorded.response_body
    assert recorded.response_body.startswith("bad ") and recorded.response_body.endswith(" too")


def test_a_huge_body_is_read_only_up_to_the_cap(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    size = 50 * 1024 * 1024

    def huge(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: " + str(size).encode() + b"\r\n\r\n")
        chunk = b"x" * 65536
        for _ in range(size // len(chunk)):
            if stop.is_set():
                return
            conn.sendall(chunk)

    receiver = serve(huge)
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.http_status) == ("delivered", 200)
    assert recorded.response_body == "x" * LIMITS.max_response_bytes


def test_a_body_trickling_one_byte_a_second_is_cut_off_at_the_deadline(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    receiver = serve(trickle(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n", b"y" * 100))
    recorded = deliver(make_sender(), receiver.url())
    # Then it counts as a timeout, retried, although each byte came well within the read timeout
    assert (recorded.outcome, recorded.http_status, recorded.error_class) == (
        "pending",
        None,
        "total_timeout",
    )


def test_headers_trickling_one_byte_a_second_are_cut_off_at_the_deadline(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    receiver = serve(trickle(b"HTTP/1.1 200 OK\r\n", b"x-slow: " + b"z" * 100))
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.error_class) == ("pending", "total_timeout")


def test_an_endless_run_of_100_continue_is_cut_off_at_the_deadline(
    serve: Serve, make_sender: MakeSender, deliver: Deliver
) -> None:
    def endless(conn: socket.socket, stop: threading.Event) -> None:
        while not stop.wait(0.01):
            conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    receiver = serve(endless)
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.error_class) == ("pending", "total_timeout")


# --- Status lines and headers --------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "outcome", "status", "error_class"),
    [
        # Header values and a reason phrase outside latin-1 (UTF-8 bytes, and bytes no charset has)
        (
            "HTTP/1.1 200 Tamam ✓\r\nx-note: 請求書 alındı\r\n".encode()
            + b"x-raw: \xff\xfe\r\ncontent-length: 2\r\n\r\nok",
            "delivered",
            200,
            None,
        ),
        (b"HTTP/1.1 503\r\ncontent-length: 0\r\n\r\n", "pending", 503, None),  # no reason phrase
        (b"HTTP/1.1 204 \r\n\r\n", "delivered", 204, None),  # an empty reason phrase
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", "delivered", 204, None),
        (b"HTTP/1.0 200 OK\r\n\r\nthanks", "delivered", 200, None),  # body until close
        (b"HTTP/1.1 999 Whatever\r\ncontent-length: 0\r\n\r\n", "pending", 999, None),
        (
            b"HTTP/1.1 302 Found\r\nlocation: http://10.0.0.1/\r\ncontent-length: 0\r\n\r\n",
            "failed",
            302,
            None,
        ),
        (
            b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\nconnection: upgrade\r\n\r\n",
            "pending",
            None,
            "protocol_error",
        ),
        (b"FOO BAR\r\n\r\n", "pending", None, "protocol_error"),  # a status line no parser takes
        (b"HTTP/1.1 1000 Huh\r\ncontent-length: 0\r\n\r\n", "pending", None, "protocol_error"),
        (b"HTTP/1.1 200 OK\r\ncontent-le", "pending", None, "protocol_error"),  # closed mid-headers
        (b"", "pending", None, "protocol_error"),  # closed without a word
        (b"HTTP/1.1 200 OK\r\nx-bad: a\x00b\r\ncontent-length: 0\r\n\r\n", "pending", None, "protocol_error"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", "pending", None, "protocol_error"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nabc",
            "pending",
            None,
            "protocol_error",
        ),  # cut short
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "pending", None, "protocol_error"),
    ],
)
def test_every_status_line_and_header_block_is_recorded_with_an_outcome(
    serve: Serve,
    make_sender: MakeSender,
    deliver: Deliver,
    answer: bytes,
    outcome: str,
    status: int | None,
    error_class: str | None,
) -> None:
    receiver = serve(raw(answer))
    recorded = deliver(make_sender(), receiver.url())
    assert (recorded.outcome, recorded.http_status, recorded.error_class) == (outcome, status, error_class)
    assert recorded.delivery_state == outcome
    # One request: a redirect is never followed
    assert len(receiver.requests) == 1


# --- Host names ----------------------------------------------------------------------------


def _hosts(answers: dict[str, list[str]], asked: list[str]) -> Resolver:
    """A resolver with a fixed table, like /etc/hosts; a name it does not know does not resolve."""

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        if host not in answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return answers[host]

    return resolve


@pytest.mark.parametrize("written", ["bücher.example", "BÜCHER.example", "xn--bcher-kva.example"])
def test_an_internationalised_host_is_resolved_and_sent_in_its_ascii_form(
    serve: Serve, make_sender: MakeSender, deliver: Deliver, written: str
) -> None:
    receiver = serve(raw(b"HTTP/1.1 204 No Content\r\n\r\n"))
    asked: list[str] = []
    sender = make_sender(_hosts({"xn--bcher-kva.example": ["127.0.0.1"]}, asked))
    recorded = deliver(sender, receiver.url(written))
    assert (recorded.outcome, recorded.http_status) == ("delivered", 204)
    assert asked == ["xn--bcher-kva.example"]
    assert receiver.host_header() == f"xn--bcher-kva.example:{receiver.port}"


def test_an_internationalised_host_that_does_not_resolve_is_a_retried_dns_error(
    make_sender: MakeSender, deliver: Deliver
) -> None:
    asked: list[str] = []
    recorded = deliver(make_sender(_hosts({}, asked)), "http://bücher.example:8080/hooks")
    assert (recorded.outcome, recorded.http_status, recorded.error_class) == ("pending", None, "dns_error")
    assert asked == ["xn--bcher-kva.example"]
    assert recorded.response_body is not None and "does not resolve" in recorded.response_body


def test_an_internationalised_host_resolving_to_a_private_address_is_refused(
    make_sender: MakeSender, deliver: Deliver
) -> None:
    recorded = deliver(
        make_sender(_hosts({"xn--bcher-kva.example": ["10.0.0.1"]}, [])), "http://bücher.example/h"
    )
    assert (recorded.outcome, recorded.error_class) == ("failed", "egress_refused")
    assert recorded.delivery_state == "failed" and recorded.reason.startswith("egress_refused")


@pytest.mark.parametrize(
    "host",
    [
        "a" * 64 + ".example",  # a label over 63 characters
        "ü" * 60 + ".example",  # 60 characters, past 63 once encoded
        "erp..example",  # an empty label
        "erp.exa%6dple",  # a character no host name has
    ],
)
def test_a_host_that_cannot_be_encoded_fails_the_delivery_without_a_lookup(
    make_sender: MakeSender, deliver: Deliver, host: str
) -> None:
    asked: list[str] = []
    recorded = deliver(make_sender(_hosts({}, asked)), f"http://{host}/hooks")
    assert (recorded.outcome, recorded.http_status, recorded.error_class) == ("failed", None, "invalid_url")
    assert recorded.reason.startswith("invalid_url")
    assert asked == []
