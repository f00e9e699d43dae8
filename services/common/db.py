"""psycopg 3 connection pools with dict rows; nothing connects until a pool is opened.

Every session carries limits for its role, so no session can hang the system (DESIGN §5.12): a
statement or a lock wait that runs too long is cancelled, a transaction left idle (a frozen
process) is ended and its locks released, and TCP keepalives plus a user timeout notice a peer
that vanished without a word. A cut connection then fails fast and the caller's failure class
(transient) decides what happens next.

A service's session also takes its database role (``db_role``, e.g. ``fatura_delivery``, made by
migration 0007) when ``FATURA_DB_ROLES`` is on, so it holds only that role's grants; admin sessions
(migrations, CLI, tests) keep the login user's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
import psycopg
from psycopg import AsyncConnection, AsyncCursor, Connection
from psycopg.adapt import AdaptersMap
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import set_json_dumps
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from services.common.settings import CommonSettings

SyncPool = ConnectionPool[Connection[DictRow]]
AsyncPool = AsyncConnectionPool[AsyncConnection[DictRow]]


@dataclass(frozen=True)
class SessionLimits:
    """Milliseconds; 0 is no limit."""

    statement_timeout_ms: int
    lock_timeout_ms: int
    idle_in_transaction_ms: int


# By role: the edge answers people, so it gives up soonest; workers and the relay write short
# transactions; the schedulers' passes read more; admin (migrations, CLI, tests) is unlimited.
ROLE_LIMITS: dict[str, SessionLimits] = {
    "edge": SessionLimits(statement_timeout_ms=5_000, lock_timeout_ms=2_000, idle_in_transaction_ms=10_000),
    "worker": SessionLimits(
        statement_timeout_ms=15_000, lock_timeout_ms=5_000, idle_in_transaction_ms=30_000
    ),
    "relay": SessionLimits(statement_timeout_ms=15_000, lock_timeout_ms=5_000, idle_in_transaction_ms=30_000),
    "scheduler": SessionLimits(
        statement_timeout_ms=30_000, lock_timeout_ms=5_000, idle_in_transaction_ms=60_000
    ),
    "admin": SessionLimits(statement_timeout_ms=0, lock_timeout_ms=0, idle_in_transaction_ms=0),
}

# libpq: probe an idle connection after 5 s, every 2 s, give up after 3 misses; unacknowledged
# writes fail after 10 s (tcp_user_timeout), and a connect attempt after 5 s.
KEEPALIVES: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,
    "connect_timeout": 5,
}


def jsonb_dumps(value: Any) -> bytes | str:
    """A ``Jsonb``/``Json`` parameter as JSON text: orjson's bytes (a tenth of the stdlib's time on
    a result or an event payload), or the stdlib's text for what orjson refuses (an int past 64
    bits, a type it does not know), so nothing that stored before fails now. The two differ only
    where jsonb cannot tell (spacing, escapes), and in that orjson writes a NaN float as null where
    the stdlib writes ``NaN``, which PostgreSQL refuses."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # orjson.JSONEncodeError
        return json.dumps(value)


# The adapters of every session opened here: psycopg's defaults, with JSON dumped by jsonb_dumps.
ADAPTERS = AdaptersMap(psycopg.adapters)
set_json_dumps(jsonb_dumps, ADAPTERS)

# A database role name goes into libpq's options string: only plain identifiers.
_DB_ROLE = re.compile(r"^fatura_[a-z]{1,40}$")


def session_kwargs(
    name: str, role: str, *, autocommit: bool = False, db_role: str | None = None
) -> dict[str, Any]:
    """Connection arguments for a session of ``role`` (a key of ``ROLE_LIMITS``), acting as the
    database role ``db_role`` when one is given."""
    limits = ROLE_LIMITS[role]
    options = (
        f"-c statement_timeout={limits.statement_timeout_ms} -c lock_timeout={limits.lock_timeout_ms} "
        f"-c idle_in_transaction_session_timeout={limits.idle_in_transaction_ms}"
    )
    if db_role is not None:
        if not _DB_ROLE.match(db_role):
            raise ValueError(f"not a service's database role: {db_role!r}")
        options += f" -c role={db_role}"
    return {
        "application_name": f"fatura-{name}",
        "row_factory": dict_row,
        "context": ADAPTERS,
        "autocommit": autocommit,
        "options": options,
        **KEEPALIVES,
    }


def sync_pool(
    settings: CommonSettings,
    *,
    name: str,
    max_size: int | None = None,
    role: str = "admin",
    autocommit: bool = False,
    db_role: str | None = None,
) -> SyncPool:
    """A blocking pool (relay, CLI, workers). Call ``open()`` or use it as a context manager."""
    size = max_size or settings.db_pool_max
    return ConnectionPool(
        settings.database_url,
        connection_class=Connection[DictRow],
        min_size=min(settings.db_pool_min, size),
        max_size=size,
        kwargs=session_kwargs(name, role, autocommit=autocommit, db_role=_db_role(settings, db_role)),
        name=name,
        open=False,
        timeout=settings.db_pool_timeout_seconds,
        # Keep trying to reconnect through a long outage instead of giving up after 5 minutes.
        reconnect_timeout=3600.0,
    )


def async_pool(
    settings: CommonSettings,
    *,
    name: str,
    max_size: int | None = None,
    autocommit: bool = False,
    role: str = "admin",
    db_role: str | None = None,
) -> AsyncPool:
    """An asyncio pool (HTTP edge). Open it in the application's lifespan."""
    size = max_size or settings.db_pool_max
    return AsyncConnectionPool(
        settings.database_url,
        connection_class=AsyncConnection[DictRow],
        min_size=min(settings.db_pool_min, size),
        max_size=size,
        kwargs=session_kwargs(name, role, autocommit=autocommit, db_role=_db_role(settings, db_role)),
        name=name,
        open=False,
        timeout=settings.db_pool_timeout_seconds,
        reconnect_timeout=3600.0,
    )


def connect(
    settings: CommonSettings,
    *,
    autocommit: bool = False,
    role: str = "admin",
    name: str = "cli",
    db_role: str | None = None,
) -> Connection[DictRow]:
    """A single connection with dict rows, for short CLI tasks and listeners."""
    kwargs = session_kwargs(name, role, autocommit=autocommit, db_role=_db_role(settings, db_role))
    return Connection.connect(settings.database_url, **kwargs)


async def async_connect(
    settings: CommonSettings,
    *,
    autocommit: bool = False,
    role: str = "admin",
    name: str = "cli",
    db_role: str | None = None,
) -> AsyncConnection[DictRow]:
    """A single asyncio connection with dict rows, for a listener of its own."""
    kwargs = session_kwargs(name, role, autocommit=autocommit, db_role=_db_role(settings, db_role))
    return await AsyncConnection.connect(settings.database_url, **kwargs)


def _db_role(settings: CommonSettings, db_role: str | None) -> str | None:
    return db_role if settings.db_roles else None


R = TypeVar("R")
_CURSORS = "_fatura_statement_cursors"


def statement_cursor(conn: AsyncConnection[R], name: str, index: int = 0) -> AsyncCursor[R]:
    """The cursor ``conn`` keeps for the statement ``name``, for a statement a process runs on every
    request (``accept_job``); ``index`` names one of several, for statements pipelined together (each
    keeps its own result until it is read).

    ``conn.execute`` makes a new cursor each time, and with it a new adapters map and transformer
    that look up every parameter's dumper again; a cursor that runs the same query object again
    keeps its transformer. The cursor lives as long as its connection (it is kept on it, so a
    connection the pool discards takes its cursors along), and is used only while its connection
    is checked out, by one task.
    """
    cursors: dict[tuple[str, int], AsyncCursor[R]] | None = getattr(conn, _CURSORS, None)
    if cursors is None:
        cursors = {}
        setattr(conn, _CURSORS, cursors)
    cursor = cursors.get((name, index))
    if cursor is None or cursor.closed:
        cursor = cursors[name, index] = conn.cursor()
    return cursor
