"""A webhook receiver with a durable inbox: verify, record the webhook-id and apply the effect in one
SQLite transaction, and answer 2xx only after that commit.

Fatura delivers at least once: a delivery is retried until it is answered 2xx, with the same
``webhook-id`` each time. The inbox turns that into exactly one effect: a webhook-id seen before
with the same payload is answered ``duplicate`` without calling ``apply`` again; the same id with a
different payload is refused (409) and counted as an alert, never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fatura_sdk._queries import load_queries
from fatura_sdk.webhooks import (
    DEFAULT_TOLERANCE_S,
    MalformedPayloadError,
    Secrets,
    WebhookVerificationError,
    decode_secrets,
    verify,
)

log = logging.getLogger("fatura_sdk.receiver")

PING = "webhook.ping.v1"
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
_Q = load_queries("inbox.sql")


@dataclass(frozen=True)
class Event:
    """A verified webhook as ``apply`` sees it: the parsed body and the webhook-id it came under."""

    webhook_id: str
    type: str
    data: dict[str, Any]
    body: dict[str, Any]

    @property
    def id(self) -> str | None:
        event_id = self.body.get("id")
        return event_id if isinstance(event_id, str) else None


Apply = Callable[[sqlite3.Connection, Event], None]
"""The partner's effect, run inside the inbox transaction on the same connection."""


class InvalidEvent(Exception):
    """Raised by ``apply`` for an event it cannot use; the transaction is rolled back and it is a 400."""


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]
    # accepted, duplicate, conflict, ping, unauthorized, bad_request, too_large, error
    outcome: str
    webhook_id: str | None = None


def payload_digest(event: Mapping[str, Any]) -> str:
    """sha256 of the event's canonical JSON: a sender that re-serializes the same event on a retry
    (other key order or spacing) is not mistaken for a different payload."""
    canonical = json.dumps(event, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def connect(db_path: str | Path) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, and fsync on every commit."""
    if str(db_path) != ":memory:":
        Path(db_path).parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(db_path), isolation_level=None, check_same_thread=False, timeout=10.0)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    # FULL: a commit is on disk before we answer 2xx, so a power cut cannot undo an acknowledged event.
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


class Receiver:
    """``handle(headers, raw_body)`` is the whole protocol; the transport only maps its Response.

    One connection, one lock: SQLite has a single writer anyway, and holding the lock across
    insert + apply + commit keeps a concurrent duplicate from racing its twin.
    """

    def __init__(
        self,
        secrets: Secrets,
        db_path: str | Path,
        apply: Apply,
        *,
        tolerance_s: int = DEFAULT_TOLERANCE_S,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        schema: str | None = None,
    ) -> None:
        self._keys = _keys(secrets)
        self._apply = apply
        self._tolerance_s = tolerance_s
        self._max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._process_counts: Counter[str] = Counter()
        self._count_lock = threading.Lock()  # refusals are counted outside the inbox lock
        self._conn = connect(db_path)
        self._conn.executescript(_Q["create_schema"])
        if schema:
            self._conn.executescript(schema)

    def set_secrets(self, secrets: Secrets) -> None:
        """Replace the accepted secrets (rotation); a bad secret raises and changes nothing.

        With no secret at all every webhook is refused (401 ``no_secret_configured``): a receiver
        can start before it is told its endpoint's secret, but it never accepts unverified input.
        """
        self._keys = _keys(secrets)

    @property
    def secret_count(self) -> int:
        return len(self._keys)

    def handle(self, headers: Mapping[str, str], raw_body: bytes, *, now: float | None = None) -> Response:
        if len(raw_body) > self._max_body_bytes:
            return self._reject(413, "too_large", "payload_too_large", "the body is over the size limit")
        if not self._keys:
            log.warning("webhook refused: this receiver has no secret configured")
            return self._reject(401, "unauthorized", "no_secret_configured", "the receiver has no secret yet")
        try:
            event = verify(self._keys, headers, raw_body, tolerance_s=self._tolerance_s, now=now)
        except MalformedPayloadError as exc:
            return self._reject(400, "bad_request", exc.code, str(exc))
        except WebhookVerificationError as exc:
            log.warning("webhook refused (%s): %s", exc.code, exc)
            return self._reject(401, "unauthorized", exc.code, str(exc))
        webhook_id = {k.lower(): v for k, v in headers.items()}["webhook-id"].strip()
        event_type = event.get("type")
        if not isinstance(event_type, str) or not isinstance(event.get("data"), dict):
            message = "an event needs a type and a data object"
            return self._reject(400, "bad_request", "malformed_payload", message)
        if event_type == PING:
            self._count("ping")
            log.info("webhook ping %s verified", webhook_id)
            return Response(200, {"status": "pong"}, "ping", webhook_id)
        with self._lock:
            return self._record_and_apply(Event(webhook_id, event_type, event["data"], event))

    def stats(self) -> dict[str, int]:
        """Durable counts (accepted, duplicate, conflict) survive restarts; refusals are per process."""
        with self.connection() as conn:
            durable = {row["name"]: int(row["value"]) for row in conn.execute(_Q["counters"])}
        counts = {"accepted": 0, "duplicate": 0, "conflict": 0}
        counts.update(durable)
        with self._count_lock:
            for name in ("ping", "unauthorized", "bad_request", "too_large", "error"):
                counts[name] = self._process_counts[name]
        return counts

    @contextmanager
    def connection(self) -> Iterator[sqlite3.Connection]:
        """The receiver's connection, for reads of the partner's own tables between requests."""
        with self._lock:
            yield self._conn

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _record_and_apply(self, event: Event) -> Response:
        webhook_id, event_type = event.webhook_id, event.type
        digest = payload_digest(event.body)
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            inserted = conn.execute(
                _Q["insert_inbox"],
                {
                    "webhook_id": webhook_id,
                    "payload_digest": digest,
                    "event_type": event_type,
                    "event_id": event.id,
                    "received_at": time.time(),
                },
            ).rowcount
            if inserted == 0:
                response = self._seen_before(webhook_id, digest)
            else:
                self._apply(conn, event)
                conn.execute(_Q["bump_counter"], {"name": "accepted"})
                body = {"status": "accepted", "webhook_id": webhook_id}
                response = Response(200, body, "accepted", webhook_id)
            conn.execute("COMMIT")
        except InvalidEvent as exc:
            _rollback(conn)
            return self._reject(400, "bad_request", "invalid_event", str(exc))
        except Exception:
            _rollback(conn)
            log.exception("webhook %s: apply failed; rolled back, the sender will retry", webhook_id)
            return self._reject(500, "error", "apply_failed", "the event could not be applied; retry later")
        if response.outcome == "accepted":
            log.info("webhook %s (%s) accepted and applied", webhook_id, event_type)
        return response

    def _seen_before(self, webhook_id: str, digest: str) -> Response:
        conn = self._conn
        stored = conn.execute(_Q["inbox_digest"], {"webhook_id": webhook_id}).fetchone()["payload_digest"]
        if stored == digest:
            conn.execute(_Q["count_duplicate"], {"webhook_id": webhook_id})
            conn.execute(_Q["bump_counter"], {"name": "duplicate"})
            log.info("webhook %s is a duplicate; not applied again", webhook_id)
            return Response(200, {"status": "duplicate", "webhook_id": webhook_id}, "duplicate", webhook_id)
        conn.execute(_Q["bump_counter"], {"name": "conflict"})
        log.error(
            "ALERT webhook %s arrived again with a different payload (digest %s, stored %s); refused",
            webhook_id,
            digest[:16],
            stored[:16],
        )
        body = {
            "error": {
                "code": "webhook_id_conflict",
                "message": "this webhook-id was already accepted with a different payload",
            }
        }
        return Response(409, body, "conflict", webhook_id)

    def _count(self, outcome: str) -> None:
        with self._count_lock:
            self._process_counts[outcome] += 1

    def _reject(self, status: int, outcome: str, code: str, message: str) -> Response:
        self._count(outcome)
        return Response(status, {"error": {"code": code, "message": message}}, outcome)


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _keys(secrets: Secrets) -> tuple[bytes, ...]:
    if isinstance(secrets, str | bytes):
        return decode_secrets(secrets)
    items = list(secrets)
    return decode_secrets(items) if items else ()
