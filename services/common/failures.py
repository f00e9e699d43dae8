"""What a consumer or publisher met, classified in one place: transient, poison or unexpected.

*Transient* is the weather of a distributed system (DESIGN §5.12): PostgreSQL, RabbitMQ or Redis
restarting, failing over or dropping a connection, a pool that timed out, a serialization
failure, a deadlock, a statement or lock timeout, a limiter that cannot be reached. A transient
failure never dead-letters a message, never ends a job and never exits a process: the message is
redelivered with backoff and the connection re-established.

*Poison* is a message no retry can fix: malformed, of an unknown type or version, a digest
conflict. It is recorded in ``dead_letters`` with its reason and taken off the queue.

*Unexpected* is everything else (a bug, a constraint the code did not foresee): redelivered a few
times with backoff like a transient failure, in case it was one after all, then dead-lettered with
its reason, so it neither loops forever nor vanishes.
"""

from __future__ import annotations

from enum import StrEnum

import dramatiq.errors
import pika.exceptions
import psycopg
import psycopg_pool
import redis.exceptions


class Failure(StrEnum):
    TRANSIENT = "transient"
    POISON = "poison"
    UNEXPECTED = "unexpected"


class Poison(Exception):
    """A message no consumer can act on. ``reason`` is a short code an operator filters by
    (malformed, unknown_type, unknown_version, too_large, digest_conflict, ...)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class Unavailable(Exception):
    """A dependency of ours (the limiter, say) cannot be reached right now: transient."""


# SQLSTATE classes and codes that say "the server, the connection or the moment", not "the data".
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
_TRANSIENT_SQLSTATES = frozenset(
    {
        "55P03",  # lock_not_available (lock_timeout)
        "25P03",  # idle_in_transaction_session_timeout
        "25006",  # read_only_sql_transaction: a replica during failover
        "55000",  # object_not_in_prerequisite_state: e.g. a standby being promoted
    }
)

_TRANSIENT_TYPES: tuple[type[BaseException], ...] = (
    psycopg_pool.PoolTimeout,
    psycopg_pool.PoolClosed,
    pika.exceptions.AMQPConnectionError,
    pika.exceptions.AMQPChannelError,
    dramatiq.errors.BrokerConnectionError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    ConnectionError,  # the builtin: reset, refused, aborted, broken pipe
    TimeoutError,
    Unavailable,
)


def classify(exc: BaseException) -> Failure:
    """The class of ``exc`` (or of the error that caused it, when it wraps one)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = _classify_one(current)
        if kind is not Failure.UNEXPECTED:
            return kind
        current = current.__cause__ or current.__context__
    return Failure.UNEXPECTED


def is_transient(exc: BaseException) -> bool:
    return classify(exc) is Failure.TRANSIENT


def _classify_one(exc: BaseException) -> Failure:
    if isinstance(exc, Poison):
        return Failure.POISON
    if isinstance(exc, _TRANSIENT_TYPES):
        return Failure.TRANSIENT
    if isinstance(exc, psycopg.Error):
        state = exc.sqlstate
        if state is None:
            # No SQLSTATE: the client lost the server (closed connection, broken socket).
            return Failure.TRANSIENT if isinstance(exc, psycopg.OperationalError) else Failure.UNEXPECTED
        if state[:2] in _TRANSIENT_SQLSTATE_CLASSES or state in _TRANSIENT_SQLSTATES:
            return Failure.TRANSIENT
    return Failure.UNEXPECTED
