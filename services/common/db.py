"""psycopg 3 connection pools with dict rows; nothing connects until a pool is opened."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection, Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from services.common.settings import CommonSettings

SyncPool = ConnectionPool[Connection[DictRow]]
AsyncPool = AsyncConnectionPool[AsyncConnection[DictRow]]


def _kwargs(name: str, autocommit: bool = False) -> dict[str, Any]:
    return {"application_name": f"fatura-{name}", "row_factory": dict_row, "autocommit": autocommit}


def sync_pool(settings: CommonSettings, *, name: str, max_size: int | None = None) -> SyncPool:
    """A blocking pool (relay, CLI, workers). Call ``open()`` or use it as a context manager."""
    size = max_size or settings.db_pool_max
    return ConnectionPool(
        settings.database_url,
        connection_class=Connection[DictRow],
        min_size=min(settings.db_pool_min, size),
        max_size=size,
        kwargs=_kwargs(name),
        name=name,
        open=False,
        timeout=10.0,
    )


def async_pool(
    settings: CommonSettings, *, name: str, max_size: int | None = None, autocommit: bool = False
) -> AsyncPool:
    """An asyncio pool (HTTP edge). Open it in the application's lifespan."""
    size = max_size or settings.db_pool_max
    return AsyncConnectionPool(
        settings.database_url,
        connection_class=AsyncConnection[DictRow],
        min_size=min(settings.db_pool_min, size),
        max_size=size,
        kwargs=_kwargs(name, autocommit),
        name=name,
        open=False,
        timeout=10.0,
    )


def connect(settings: CommonSettings, *, autocommit: bool = False) -> Connection[DictRow]:
    """A single connection with dict rows, for short CLI tasks and listeners."""
    return Connection.connect(settings.database_url, autocommit=autocommit, row_factory=dict_row)
