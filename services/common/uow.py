"""The unit of work: a row change, its job event and its outbox event commit together or not at all.

A caller opens one, changes its row through ``execute``, calls ``record`` once per state change,
and leaves; the transaction commits on a clean exit and rolls back on an exception. No network
call other than to PostgreSQL happens inside. After the commit the relay is woken with a NOTIFY
sent outside the transaction (a NOTIFY inside it serializes every writer's commit).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncCursor, Connection, Cursor
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from services.common.ids import new_id
from services.common.queries import load_queries

Q = load_queries(Path(__file__).with_name("sql") / "uow.sql")


def _fragment(
    name: str,
    *,
    job_id: str,
    source: str = "",
    state_version: str = "%(state_version)s",
    detail: str = "%(detail)s",
    payload: str = "%(payload)s",
) -> str:
    return (
        Q[name]
        .replace("{job_id}", job_id)
        .replace("{source}", source)
        .replace("{state_version}", state_version)
        .replace("{detail}", detail)
        .replace("{payload}", payload)
    )


# The job's id is a parameter here; in the acceptance it comes from the row the statement inserts.
RECORD_JOB_EVENT = _fragment("job_event_fragment", job_id="%(job_id)s")
RECORD_CHANGE = f"WITH job_event AS ({RECORD_JOB_EVENT})\n" + _fragment(
    "outbox_event_fragment", job_id="%(job_id)s"
)


def change_ctes(source: str) -> str:
    """The job event and outbox event as CTEs selecting the job's ``id`` from the CTE ``source``:
    a statement that inserts a job embeds these to record its first change atomically with it."""
    from_source = f"\nFROM {source}"
    return (
        f"job_event AS ({_fragment('job_event_fragment', job_id='id', source=from_source)}),\n"
        f"outbox_event AS ({_fragment('outbox_event_fragment', job_id='id', source=from_source)})"
    )


def versioned_change_ctes(source: str, *, outbox: bool = True, detail: str | None = None) -> str:
    """The change's job event (and outbox event) as CTEs that take the job's new ``state_version``
    (and, given ``detail``, the event's detail: a column of ``source``) from the CTE ``source``,
    which has just written the row and returned them: a statement that changes a job's state embeds
    these to record the change in the same statement, and records none when ``source`` wrote no row
    (a fenced write whose fence is stale). The outbox event is written only when the change's
    ``event_type`` is not null, as ``UnitOfWork.record`` writes it.

    Their parameters are the change's ``JobChange.params()``; its ``state_version`` goes unused,
    and so does its ``detail`` when ``detail`` is given."""
    from_source = f"\nFROM {source}"
    version = f"{source}.state_version"
    event_detail = f"{source}.{detail}" if detail else "%(detail)s"
    job_event = _fragment(
        "job_event_fragment",
        job_id="%(job_id)s",
        source=from_source,
        state_version=version,
        detail=event_detail,
    )
    ctes = [f"job_event AS ({job_event})"]
    if outbox:
        # Only a change with an event type publishes (RETRY_SCHEDULED is history only).
        outbox_event = _fragment(
            "outbox_event_fragment",
            job_id="%(job_id)s",
            source=f"{from_source}\nWHERE %(event_type)s::text IS NOT NULL",
            state_version=version,
            payload=f"%(payload)s || jsonb_build_object('state_version', {version})",
        )
        ctes.append(f"outbox_event AS ({outbox_event})")
    return ",\n".join(ctes)


Row = dict[str, Any]


@dataclass(frozen=True)
class JobChange:
    """One state change of one job, as the event log and the outbox record it."""

    tenant_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    state_version: int
    # The outbox event this change publishes; None for a change only the job's history records
    # (RUNNING, RETRY_SCHEDULED): no consumer acts on those.
    event_type: str | None
    detail: Mapping[str, Any] | None = None
    event_id: uuid.UUID = field(default_factory=new_id)
    # The W3C trace context the event's consumers continue (services/common/tracing.py): an id,
    # like the others the event carries.
    traceparent: str | None = None

    def params(self) -> dict[str, Any]:
        payload = {
            "event_id": str(self.event_id),
            "event_type": self.event_type,
            "tenant_id": str(self.tenant_id),
            "job_id": str(self.job_id),
            "state": self.state,
            "state_version": self.state_version,
        }
        if self.traceparent is not None:
            payload["traceparent"] = self.traceparent
        return {
            "event_id": self.event_id,
            "tenant_id": self.tenant_id,
            "job_id": self.job_id,
            "state": self.state,
            "state_version": self.state_version,
            "detail": Jsonb(dict(self.detail)) if self.detail is not None else None,
            "event_type": self.event_type,
            "payload": Jsonb(payload),
            "traceparent": self.traceparent,
        }


class UnitOfWork:
    """Blocking unit of work on one connection inside one transaction."""

    def __init__(self, conn: Connection[Row]) -> None:
        self.conn = conn
        self.recorded: list[JobChange] = []

    def execute(self, query: str, params: Mapping[str, Any] | None = None) -> Cursor[Row]:
        return self.conn.execute(query, params)

    def record(self, change: JobChange) -> uuid.UUID:
        if change.event_type is None:
            self.conn.execute(RECORD_JOB_EVENT, change.params())
            return change.event_id
        self.conn.execute(RECORD_CHANGE, change.params())
        self.recorded.append(change)
        return change.event_id

    def recorded_by_statement(self, change: JobChange) -> None:
        """``change`` was recorded by the caller's own statement (``versioned_change_ctes``): it is
        counted as recorded, for the relay's wake-up, without a statement of its own."""
        if change.event_type is not None:
            self.recorded.append(change)


@contextmanager
def unit_of_work(pool: ConnectionPool[Any]) -> Iterator[UnitOfWork]:
    with pool.connection() as conn:
        uow = UnitOfWork(conn)
        with conn.transaction():
            yield uow
        if uow.recorded:
            with conn.transaction():
                conn.execute(Q["notify_outbox"])


class AsyncUnitOfWork:
    """The asyncio twin of :class:`UnitOfWork`, for the HTTP edge."""

    def __init__(self, conn: AsyncConnection[Row]) -> None:
        self.conn = conn
        self.recorded: list[JobChange] = []

    async def execute(self, query: str, params: Mapping[str, Any] | None = None) -> AsyncCursor[Row]:
        return await self.conn.execute(query, params)

    async def record(self, change: JobChange) -> uuid.UUID:
        if change.event_type is None:
            await self.conn.execute(RECORD_JOB_EVENT, change.params())
            return change.event_id
        await self.conn.execute(RECORD_CHANGE, change.params())
        self.recorded.append(change)
        return change.event_id


class OutboxNotifier:
    """Coalesces relay wake-ups: many commits within ``window`` seconds send one NOTIFY."""

    def __init__(self, pool: AsyncConnectionPool[Any], window: float = 0.05) -> None:
        self._pool = pool
        self._window = window
        self._pending: asyncio.Task[None] | None = None

    def poke(self) -> None:
        if self._pending is None or self._pending.done():
            self._pending = asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        await asyncio.sleep(self._window)
        # The relay's periodic sweep covers a lost wake-up, so failure here is only latency.
        try:
            async with self._pool.connection() as conn:
                if conn.autocommit:
                    await conn.execute(Q["notify_outbox"])
                else:
                    async with conn.transaction():
                        await conn.execute(Q["notify_outbox"])
        except (psycopg.Error, PoolTimeout):
            return


@asynccontextmanager
async def async_unit_of_work(
    pool: AsyncConnectionPool[Any], notifier: OutboxNotifier | None = None
) -> AsyncIterator[AsyncUnitOfWork]:
    async with pool.connection() as conn:
        uow = AsyncUnitOfWork(conn)
        async with conn.transaction():
            yield uow
    if uow.recorded and notifier is not None:
        notifier.poke()
