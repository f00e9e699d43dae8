"""fatura_sdk.acks: the signed acknowledgement a partner ERP sends, checked by the standardwebhooks
library, and what ``acknowledge`` makes of Fatura's answers."""

from __future__ import annotations

import base64
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import standardwebhooks

from fatura_sdk import AckResponse, AckUnreachable, ack_request, acknowledge, verify_signature
from fatura_sdk.acks import MAX_REASON_LENGTH, ack_body

SECRET = "whsec_" + base64.b64encode(b"secret-of-the-erp-endpoint-0123").decode()
OTHER = "whsec_" + base64.b64encode(b"secret-of-another-endpoint-4567").decode()
DELIVERY = "5d1c3a9e-7c41-5e0b-9c2f-1a2b3c4d5e6f"


def test_standardwebhooks_verifies_the_sdks_acknowledgement_and_the_body_names_the_delivery() -> None:
    url, headers, body = ack_request("https://api.fatura.example/", DELIVERY, "posted", None, SECRET)

    assert url == f"https://api.fatura.example/v1/deliveries/{DELIVERY}:ack"
    assert standardwebhooks.Webhook(SECRET).verify(body, headers) == {
        "outcome": "posted",
        "delivery_id": DELIVERY,
    }
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        standardwebhooks.Webhook(OTHER).verify(body, headers)


def test_a_rejection_carries_its_reason_and_a_fresh_id_each_time() -> None:
    first = ack_request("https://x", DELIVERY, "rejected", "duplicate invoice number 7", SECRET)
    second = ack_request("https://x", DELIVERY, "rejected", "duplicate invoice number 7", SECRET)

    assert json.loads(first.body)["reason"] == "duplicate invoice number 7"
    assert first.headers["webhook-id"] != second.headers["webhook-id"]
    assert verify_signature(SECRET, first.headers, first.body) == first.headers["webhook-id"]


def test_during_a_rotation_both_secrets_sign() -> None:
    request = ack_request("https://x", DELIVERY, "posted", None, [OTHER, SECRET])
    assert len(request.headers["webhook-signature"].split()) == 2
    assert standardwebhooks.Webhook(SECRET).verify(request.body, request.headers)["outcome"] == "posted"


@pytest.mark.parametrize(
    ("outcome", "reason"),
    [
        ("booked", None),
        ("rejected", None),
        ("rejected", "  "),
        ("rejected", "x" * (MAX_REASON_LENGTH + 1)),
        ("posted", "why not"),
    ],
)
def test_an_acknowledgement_fatura_would_refuse_is_refused_before_it_is_sent(
    outcome: str, reason: str | None
) -> None:
    with pytest.raises(ValueError):
        ack_body(DELIVERY, outcome, reason)


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (200, None, False),
        (409, "delivery_not_delivered", True),
        (409, "ack_conflict", False),
        (401, "bad_signature", False),
        (429, "x", True),
        (503, "database_unavailable", True),
        (404, "not_found", False),
    ],
)
def test_which_answers_are_worth_asking_again(status: int, code: str | None, retryable: bool) -> None:
    body: dict[str, Any] = {} if code is None else {"error": {"code": code, "message": "m"}}
    assert AckResponse(status, body).retryable is retryable


class _Fatura:
    """Answers every acknowledgement with one canned status and body; keeps what it received."""

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        received = self.received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length", "0")))
                received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, raw))
                payload = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def conflict() -> Iterator[_Fatura]:
    fatura = _Fatura(409, {"error": {"code": "ack_conflict", "message": "acknowledged posted already"}})
    yield fatura
    fatura.server.shutdown()
    fatura.server.server_close()


def test_acknowledge_posts_the_signed_request_and_returns_any_answer(conflict: _Fatura) -> None:
    answer = acknowledge(conflict.url, DELIVERY, "rejected", "wrong supplier", SECRET, timeout=5)

    assert (answer.status, answer.code, answer.ok, answer.retryable) == (409, "ack_conflict", False, False)
    path, headers, body = conflict.received[0]
    assert path == f"/v1/deliveries/{DELIVERY}:ack"
    assert standardwebhooks.Webhook(SECRET).verify(body, headers)["reason"] == "wrong supplier"


def test_acknowledge_says_unreachable_when_nothing_answers() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # bound, never listening: the connection is refused
        with pytest.raises(AckUnreachable):
            acknowledge(f"http://127.0.0.1:{port}", DELIVERY, "posted", None, SECRET, timeout=2)
