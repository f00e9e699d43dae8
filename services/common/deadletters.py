"""Dead letters: the broker messages that were taken off their queue, why, and how to send them back.

Two ways in, one table (``dead_letters``), each row with the whole message so a redrive republishes
exactly what was refused:

- a consumer refuses a message (poison, or an unexpected error that kept recurring): the
  ``Redelivery`` middleware records it here and acks it (``source = 'consumer'``);
- RabbitMQ dead-letters a message to ``<queue>.XQ`` (the delivery limit was reached because the
  message kept killing its worker; a body that is not a message at all): the schedulers drain those
  queues into this table (``source = 'broker'``), with RabbitMQ's reason.

A redrive is asked for in the database (``request_redrive``: the CLI and the operator endpoint) and
carried out by the scheduler of the queue's service (``publish_requested``), which publishes the
stored message to its queue again with its original message id; consumers dedup by event id, so a
redrive is itself idempotent, and the edge never talks to RabbitMQ.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dramatiq
import pika.exceptions
from dramatiq.common import xq_name
from dramatiq.errors import DecodeError
from prometheus_client import Counter, Gauge
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from services.common import events
from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "deadletters.sql")

BODY_EXCERPT = 2_000

DEAD_LETTERED = Counter(
    "fatura_dead_letters_total",
    "Messages taken off their queue into dead_letters, by queue, reason and who refused them",
    ["queue", "reason", "source"],
)
REDRIVEN = Counter("fatura_dead_letters_redriven_total", "Dead letters published again", ["queue"])
DEPTH = Gauge("fatura_dead_letters_open", "Dead letters not redriven, by queue", ["queue"])
OLDEST = Gauge(
    "fatura_dead_letters_oldest_age_seconds",
    "Age of the oldest dead letter not redriven, by queue",
    ["queue"],
)


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    actor: str
    message_id: str | None
    reason: str
    detail: str
    source: str
    at: datetime
    redriven_at: datetime | None
    redrive_count: int
    redrive_requested_at: datetime | None
    message: dict[str, Any] | None
    body: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> DeadLetter:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "queue": self.queue,
            "actor": self.actor,
            "message_id": self.message_id,
            "reason": self.reason,
            "detail": self.detail,
            "source": self.source,
            "at": self.at.isoformat(),
            "redrive_requested_at": _iso(self.redrive_requested_at),
            "redriven_at": _iso(self.redriven_at),
            "redrive_count": self.redrive_count,
        }

    def as_json(self) -> dict[str, Any]:
        return {**self.summary(), "message": self.message, "body": self.body}


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _clean(text: str) -> str:
    # PostgreSQL text and jsonb refuse NUL; a refused message may well carry one.
    return text.replace("\x00", "\ufffd")


def _jsonable(value: Any) -> Any:
    """``value`` as JSON PostgreSQL accepts (no NUL in any string), or None when it is not JSON."""
    try:
        text = json.dumps(value, default=str, ensure_ascii=False)
    except (TypeError, ValueError):
        return None
    return json.loads(_clean(text))


def record(
    pool: ConnectionPool[Any],
    *,
    queue: str,
    actor: str,
    message_id: str | None,
    reason: str,
    detail: str,
    message: Mapping[str, Any] | None,
    body: str | None = None,
    source: str = "consumer",
) -> int:
    """Write one dead letter and return its id. Raises what the database raises: the caller must not
    drop the message unless this succeeded."""
    stored = _jsonable(dict(message)) if message is not None else None
    if body is None:
        body = json.dumps(stored, ensure_ascii=False) if stored is not None else ""
    with pool.connection() as conn:
        row = conn.execute(
            Q["record"],
            {
                "queue": queue,
                "actor": actor,
                "message_id": message_id,
                "reason": reason,
                "detail": _clean(detail)[:BODY_EXCERPT],
                "body": _clean(body)[:BODY_EXCERPT],
                "message": Jsonb(stored) if stored is not None else None,
                "source": source,
            },
        ).fetchone()
    assert row is not None
    DEAD_LETTERED.labels(queue, reason, source).inc()
    log.warning("dead letter %d: message %s on %s (%s): %s", row["id"], message_id, queue, reason, detail)
    return int(row["id"])


def drain(pool: ConnectionPool[Any], broker: Any, queues: Iterable[str], *, limit: int = 200) -> int:
    """Move what RabbitMQ dead-lettered to each queue's ``.XQ`` into ``dead_letters``; returns how
    many. A message is acked on the XQ only after its row is committed."""
    moved = 0
    for queue in queues:
        dead_queue = xq_name(queue)
        while moved < limit:
            with broker.reconnecting():
                broker.declare_queue(queue, ensure=True)  # the XQ exists once its queue was declared
                channel = broker.channel
                method, properties, raw = channel.basic_get(queue=dead_queue, auto_ack=False)
            if method is None:
                break
            reason, detail = _death(properties)
            try:
                decoded = dramatiq.Message.decode(raw)
                message: dict[str, Any] | None = decoded.asdict()
                message_id: str | None = decoded.message_id
                actor = decoded.actor_name
            except DecodeError:
                message, message_id, actor = None, None, "?"
                reason, detail = "undecodable", f"the body is not a message: {raw[:200]!r}"
            try:
                record(
                    pool,
                    queue=queue,
                    actor=actor,
                    message_id=message_id,
                    reason=reason,
                    detail=detail,
                    message=message,
                    body=None if message is not None else raw.decode("utf-8", errors="replace"),
                    source="broker",
                )
            except Exception:
                with broker.reconnecting():
                    channel.basic_nack(method.delivery_tag, requeue=True)
                raise
            with broker.reconnecting():
                channel.basic_ack(method.delivery_tag)
            moved += 1
    return moved


def _death(properties: Any) -> tuple[str, str]:
    """RabbitMQ's reason for dead-lettering (``x-first-death-reason``), as our reason code."""
    headers = (properties.headers if properties is not None else None) or {}
    raw = headers.get("x-first-death-reason", b"rejected")
    reason = raw.decode() if isinstance(raw, bytes) else str(raw)
    deaths = headers.get("x-death") or []
    count = deaths[0].get("count") if deaths and isinstance(deaths[0], dict) else None
    if reason == "delivery_limit":
        return "delivery_limit", "the message was delivered too many times without being acked"
    return reason, f"dead-lettered by RabbitMQ ({reason}, {count or 1} time(s))"


def listing(
    pool: ConnectionPool[Any],
    *,
    since: datetime | None = None,
    reason: str | None = None,
    queue: str | None = None,
    include_redriven: bool = False,
    limit: int = 100,
) -> list[DeadLetter]:
    with pool.connection() as conn:
        rows = conn.execute(
            Q["list"],
            {
                "since": since,
                "reason": reason,
                "queue": queue,
                "include_redriven": include_redriven,
                "limit": limit,
            },
        ).fetchall()
    return [DeadLetter.from_row(r) for r in rows]


def get(pool: ConnectionPool[Any], dead_letter_id: int) -> DeadLetter | None:
    with pool.connection() as conn:
        row = conn.execute(Q["get"], {"id": dead_letter_id}).fetchone()
    return DeadLetter.from_row(row) if row is not None else None


@dataclass(frozen=True)
class RedriveRequest:
    requested: list[int]  # open dead letters now marked for redrive
    unsendable: list[int]  # matched, but their body was not a message: nothing to republish


def request_redrive(
    pool: ConnectionPool[Any],
    *,
    ids: Collection[int] | None = None,
    since: datetime | None = None,
    reason: str | None = None,
    queue: str | None = None,
) -> RedriveRequest:
    """Mark the open dead letters that match for redrive; the scheduler of each queue's service
    publishes them within a sweep. Asking twice is the same as asking once."""
    params = {"ids": list(ids) if ids is not None else None, "since": since, "reason": reason, "queue": queue}
    with pool.connection() as conn, conn.transaction():
        rows = conn.execute(Q["request_redrive"], params).fetchall()
    requested = [int(r["id"]) for r in rows if r["sendable"]]
    unsendable = [int(r["id"]) for r in rows if not r["sendable"]]
    return RedriveRequest(requested, unsendable)


def pending_redrives(pool: ConnectionPool[Any], ids: Collection[int]) -> int:
    """How many of ``ids`` are still waiting to be published."""
    with pool.connection() as conn:
        row = conn.execute(Q["pending_redrives"], {"ids": list(ids)}).fetchone()
    return int(row["n"]) if row else 0


def publish_requested(
    pool: ConnectionPool[Any], broker: Any, queues: Collection[str], *, limit: int = 200
) -> int:
    """Publish the dead letters of ``queues`` an operator asked to redrive: the stored message, to its
    queue, with its original message id; then mark each redriven. Returns how many."""
    with pool.connection() as conn:
        rows = conn.execute(Q["requested_redrives"], {"queues": list(queues), "limit": limit}).fetchall()
    sent = 0
    for row in rows:
        letter = DeadLetter.from_row(row)
        message = _rebuild(letter)
        if message is None:
            log.error("dead letter %d cannot be rebuilt into a message; left as it is", letter.id)
            continue
        broker.enqueue(message)
        with pool.connection() as conn:
            conn.execute(Q["mark_redriven"], {"id": letter.id})
        REDRIVEN.labels(letter.queue).inc()
        log.info(
            "dead letter %d (%s, %s) redriven to %s",
            letter.id,
            letter.message_id,
            letter.reason,
            letter.queue,
        )
        sent += 1
    return sent


def _rebuild(letter: DeadLetter) -> dramatiq.Message[Any] | None:
    if letter.message is None:
        return None
    stored: dict[str, Any] = dict(letter.message)
    options = {k: v for k, v in (stored.get("options") or {}).items() if k not in {"redeliveries", "eta"}}
    try:
        return dramatiq.Message(
            queue_name=letter.queue,
            actor_name=str(stored.get("actor_name") or letter.actor),
            args=tuple(stored.get("args") or ()),
            kwargs=dict(stored.get("kwargs") or {}),
            options=options,
            message_id=str(stored.get("message_id") or letter.message_id),
            message_timestamp=int(stored.get("message_timestamp") or time.time() * 1000),
        )
    except (TypeError, ValueError):
        return None


def refresh_metrics(pool: ConnectionPool[Any], queues: Iterable[str]) -> None:
    with pool.connection() as conn:
        rows = {r["queue"]: r for r in conn.execute(Q["depth"]).fetchall()}
    for queue in set(queues) | set(rows):
        row = rows.get(queue)
        DEPTH.labels(queue).set(row["open"] if row else 0)
        OLDEST.labels(queue).set(row["oldest_age_seconds"] if row else 0)


def prune(pool: ConnectionPool[Any], retention_days: float) -> int:
    """Delete dead letters older than the retention; returns how many."""
    with pool.connection() as conn:
        rows = conn.execute(Q["prune"], {"days": retention_days}).fetchall()
    return len(rows)


# What operators use (the CLI and the operator endpoints): one grammar for "since", queue names
# with or without the deployment's prefix, the ids they name, reads for the asynchronous edge, and
# what RabbitMQ holds in the dead-letter queues that the schedulers have not drained yet.

_RELATIVE = r"[0-9]{1,7}[smhd]"
_ABSOLUTE = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}(T[0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}:[0-9]{2})?)?"
)
SINCE_PATTERN = f"^({_RELATIVE}|{_ABSOLUTE})$"
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_since(text: str, *, now: datetime | None = None) -> datetime:
    """``30m``, ``2h``, ``7d`` back from now, or an ISO 8601 date or date-time (UTC unless it says
    otherwise). Raises ValueError with words for the operator."""
    if re.fullmatch(_RELATIVE, text):
        seconds = int(text[:-1]) * _UNIT_SECONDS[text[-1]]
        try:
            return (now or datetime.now(UTC)) - timedelta(seconds=seconds)
        except OverflowError:
            raise ValueError(f"since {text!r} reaches back before the year 1") from None
    if re.fullmatch(_ABSOLUTE, text):
        try:
            at = datetime.fromisoformat(text)
        except ValueError as exc:
            raise ValueError(f"since {text!r} is not a real date or time: {exc}") from None
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    raise ValueError(
        f"since {text!r} is neither a time back from now (30m, 2h, 7d) nor an ISO 8601 date or "
        "date-time (2026-05-01, 2026-05-01T08:00:00Z)"
    )


def queue_named(name: str, prefix: str) -> str:
    """A queue as an operator names it: in full, or without the deployment's prefix
    (``inference.ingest``)."""
    short = {route.queue for routes in events.SERVICE_ROUTES.values() for route in routes}
    return f"{prefix}.{name}" if name in short else name


@dataclass(frozen=True)
class IdCheck:
    unknown: list[int]  # no such dead letter (never was, or pruned)
    redriven: dict[int, datetime]  # redriven already, when


def _id_check(ids: Collection[int], rows: Iterable[Mapping[str, Any]]) -> IdCheck:
    found = {int(r["id"]): r["redriven_at"] for r in rows}
    return IdCheck(
        unknown=sorted(set(ids) - set(found)),
        redriven={i: at for i, at in sorted(found.items()) if at is not None},
    )


def check_ids(pool: ConnectionPool[Any], ids: Collection[int]) -> IdCheck:
    with pool.connection() as conn:
        rows = conn.execute(Q["check_ids"], {"ids": list(ids)}).fetchall()
    return _id_check(ids, rows)


async def check_ids_async(pool: AsyncConnectionPool[Any], ids: Collection[int]) -> IdCheck:
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q["check_ids"], {"ids": list(ids)})).fetchall()
    return _id_check(ids, rows)


async def listing_async(
    pool: AsyncConnectionPool[Any],
    *,
    since: datetime | None = None,
    reason: str | None = None,
    queue: str | None = None,
    include_redriven: bool = False,
    limit: int = 100,
) -> list[DeadLetter]:
    params = {
        "since": since,
        "reason": reason,
        "queue": queue,
        "include_redriven": include_redriven,
        "limit": limit,
    }
    async with pool.connection() as conn:
        rows = await (await conn.execute(Q["list"], params)).fetchall()
    return [DeadLetter.from_row(r) for r in rows]


async def get_async(pool: AsyncConnectionPool[Any], dead_letter_id: int) -> DeadLetter | None:
    async with pool.connection() as conn:
        row = await (await conn.execute(Q["get"], {"id": dead_letter_id})).fetchone()
    return DeadLetter.from_row(row) if row is not None else None


async def request_redrive_async(
    pool: AsyncConnectionPool[Any],
    *,
    ids: Collection[int] | None = None,
    since: datetime | None = None,
    reason: str | None = None,
    queue: str | None = None,
) -> RedriveRequest:
    """``request_redrive`` for the asynchronous edge."""
    params = {"ids": list(ids) if ids is not None else None, "since": since, "reason": reason, "queue": queue}
    async with pool.connection() as conn, conn.transaction():
        rows = await (await conn.execute(Q["request_redrive"], params)).fetchall()
    requested = [int(r["id"]) for r in rows if r["sendable"]]
    unsendable = [int(r["id"]) for r in rows if not r["sendable"]]
    return RedriveRequest(requested, unsendable)


def undrained(broker: Any, queues: Iterable[str]) -> dict[str, int | None]:
    """How many messages sit in each queue's ``.XQ``: dead-lettered by RabbitMQ, not yet moved into
    ``dead_letters`` by a scheduler (None: that queue was never declared). Declares nothing. Raises
    dramatiq's ConnectionError when RabbitMQ does not answer."""
    counts: dict[str, int | None] = {}
    for queue in queues:
        with broker.reconnecting():
            try:
                frame = broker.channel.queue_declare(xq_name(queue), passive=True)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != 404:
                    raise
                del broker.channel  # the broker closed it; the next queue gets a fresh one
                counts[queue] = None
                continue
        counts[queue] = int(frame.method.message_count)
    return counts
