"""fatura_sdk.Receiver in-process: the inbox and the partner's effect commit together, once."""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from fatura_sdk import Event, InvalidEvent, Receiver, generate_secret, sign_headers

SECRET = generate_secret()


def event(job: str = "j-1", version: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "type": "extraction.completed.v1",
        "id": f"evt-{job}-{version}",
        "timestamp": "2026-11-30T07:00:00Z",
        "data": {"job_id": job, "state": "SUCCEEDED", "state_version": version, **extra},
    }


def post(receiver: Receiver, webhook_id: str, body: bytes | dict[str, Any], secret: str = SECRET) -> Any:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return receiver.handle(sign_headers(secret, webhook_id, raw), raw)


class Effects:
    """A partner effect that writes one row per call, so a second effect is visible."""

    SCHEMA = "CREATE TABLE IF NOT EXISTS effects (webhook_id TEXT, version INTEGER);"

    def __init__(self, fail_with: Exception | None = None) -> None:
        self.fail_with = fail_with

    def __call__(self, conn: sqlite3.Connection, ev: Event) -> None:
        conn.execute("INSERT INTO effects VALUES (?, ?)", (ev.webhook_id, ev.data["state_version"]))
        if self.fail_with is not None:
            raise self.fail_with


def rows(db: Path, sql: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return [tuple(r) for r in conn.execute(sql)]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "inbox.sqlite"


def test_a_new_webhook_is_applied_once_and_its_resend_is_a_duplicate(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)

    first = post(receiver, "dlv-1", event())
    again = post(receiver, "dlv-1", event())

    assert (first.status, first.body["status"]) == (200, "accepted")
    assert (again.status, again.body["status"]) == (200, "duplicate")
    assert rows(db, "SELECT * FROM effects") == [("dlv-1", 3)]
    assert rows(db, "SELECT webhook_id, duplicates FROM fatura_inbox") == [("dlv-1", 1)]


def test_the_inbox_survives_a_restart_of_the_receiver(db: Path) -> None:
    post(Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA), "dlv-1", event())

    reopened = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)

    assert post(reopened, "dlv-1", event()).body["status"] == "duplicate"
    assert rows(db, "SELECT count(*) FROM effects") == [(1,)]
    assert reopened.stats()["accepted"] == 1


def test_a_resend_serialized_differently_is_still_the_same_payload(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)
    post(receiver, "dlv-1", event())

    reordered = json.dumps(dict(reversed(list(event().items()))), indent=2).encode()

    assert post(receiver, "dlv-1", reordered).body["status"] == "duplicate"


def test_the_same_webhook_id_with_another_payload_is_refused_and_alerted(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)
    post(receiver, "dlv-1", event(version=3))

    with caplog.at_level(logging.ERROR, logger="fatura_sdk.receiver"):
        clash = post(receiver, "dlv-1", event(version=9))

    assert clash.status == 409
    assert clash.body["error"]["code"] == "webhook_id_conflict"
    assert receiver.stats()["conflict"] == 1
    assert any("dlv-1" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert rows(db, "SELECT * FROM effects") == [("dlv-1", 3)]


def test_a_bad_signature_is_401_and_stores_nothing(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)

    refused = post(receiver, "dlv-1", event(), secret=generate_secret())

    assert refused.status == 401
    assert refused.body["error"]["code"] == "bad_signature"
    assert rows(db, "SELECT count(*) FROM fatura_inbox") == [(0,)]
    assert rows(db, "SELECT count(*) FROM effects") == [(0,)]
    assert receiver.stats()["unauthorized"] == 1


def test_when_the_effect_fails_nothing_is_recorded_and_the_resend_is_applied(db: Path) -> None:
    # Given a partner effect that fails after writing (a bug or a full disk)
    failing = Receiver(SECRET, db, Effects(fail_with=RuntimeError("ledger locked")), schema=Effects.SCHEMA)

    # When the webhook arrives, it is answered 500 so the sender retries
    assert post(failing, "dlv-1", event()).status == 500
    assert rows(db, "SELECT count(*) FROM fatura_inbox") == [(0,)]
    assert rows(db, "SELECT count(*) FROM effects") == [(0,)]

    # Then the retry, once the effect works, is applied (not mistaken for a duplicate)
    working = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)
    assert post(working, "dlv-1", event()).body["status"] == "accepted"
    assert rows(db, "SELECT * FROM effects") == [("dlv-1", 3)]


def test_an_event_the_partner_cannot_use_is_400_and_stores_nothing(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(fail_with=InvalidEvent("no job_id")), schema=Effects.SCHEMA)

    answer = post(receiver, "dlv-1", event())

    assert answer.status == 400
    assert answer.body["error"] == {"code": "invalid_event", "message": "no job_id"}
    assert rows(db, "SELECT count(*) FROM fatura_inbox") == [(0,)]


def test_a_ping_is_answered_without_any_effect(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)
    ping = {"type": "webhook.ping.v1", "id": "evt-p", "timestamp": "2026-11-30T07:00:00Z", "data": {}}

    answer = post(receiver, "dlv-ping", ping)

    assert (answer.status, answer.body) == (200, {"status": "pong"})
    assert rows(db, "SELECT count(*) FROM fatura_inbox") == [(0,)]


@pytest.mark.parametrize("body", [b"[]", b"{}", b'{"type": "x", "data": 3}', b"nope"])
def test_a_signed_body_without_an_event_envelope_is_400(db: Path, body: bytes) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)

    assert post(receiver, "dlv-1", body).status == 400


def test_a_body_over_the_limit_is_413_before_anything_else(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA, max_body_bytes=100)

    assert post(receiver, "dlv-1", event(note="x" * 200)).status == 413


def test_rotating_secrets_takes_effect_for_the_next_request(db: Path) -> None:
    receiver = Receiver(SECRET, db, Effects(), schema=Effects.SCHEMA)
    new = generate_secret()
    assert post(receiver, "dlv-1", event(), secret=new).status == 401

    receiver.set_secrets([SECRET, new])

    assert post(receiver, "dlv-1", event(), secret=new).status == 200


def test_a_receiver_without_any_secret_refuses_everything_until_given_one(db: Path) -> None:
    receiver = Receiver([], db, Effects(), schema=Effects.SCHEMA)

    refused = post(receiver, "dlv-1", event())
    receiver.set_secrets([SECRET])
    accepted = post(receiver, "dlv-1", event())

    assert (refused.status, refused.body["error"]["code"]) == (401, "no_secret_configured")
    assert accepted.body["status"] == "accepted"
