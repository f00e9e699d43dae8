"""The job event feed: one reader per process turns ``job_events`` into events for every open stream.

The HTTP edge's SSE routes and the gRPC ``Watch`` both read it::

    feed = EventFeed(common, EventSettings.from_env(), pool, name="http", db_role="fatura_edge")
    await feed.start()                        # in the server's start-up; ``await feed.stop()`` at exit
    async with await feed.subscribe(tenant_id, job_id=None, last_seq=None) as subscription:
        async for batch in subscription.batches(heartbeat=15.0):
            ...                               # [] after ``heartbeat`` quiet seconds; JobEvent,
                                              # Snapshot, and End (always last) otherwise

The process holds one connection that LISTENs on ``fatura_outbox`` (a wake-up only) and, at least
every ``FATURA_EVENT_POLL_SECONDS`` while streams are open, reads the events above its watermark in
one statement for all its streams; each event is encoded once and handed to the streams of its
tenant and of its job. The watermark (``watermark.py``) never passes an event that may still commit
below it. A stream resumes from the last seq its client saw (SSE ``Last-Event-ID``): it replays from
the database up to the feed's watermark, then takes the live events above it. A stream without a
cursor, or whose cursor is older than the pruned horizon, starts with a snapshot of its jobs. A
stream too slow for its buffer stops taking live events and catches up from the database instead.

The reader survives PostgreSQL going away: it reconnects with backoff and reads on from its
watermark, so no stream loses an event; streams stay open meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import Counter
from psycopg.rows import DictRow

from services.acceptance.feed_items import End, FeedItem, JobEvent, Snapshot, SnapshotJob
from services.acceptance.settings import EventSettings
from services.acceptance.subscription import Subscription
from services.acceptance.watermark import Watermark
from services.common.api.errors import Unavailable
from services.common.db import AsyncPool, async_connect
from services.common.queries import load_queries
from services.common.settings import CommonSettings

__all__ = ["End", "EventFeed", "FeedItem", "JobEvent", "Snapshot", "SnapshotJob", "Subscription"]

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "feed.sql")

# Rows per read.
PAGE = 1000
# The feed starts this far below the newest event, so one still committing below it is not missed.
LOOKBACK = 1000
# Jobs whose last delivered version the feed remembers, to drop an event that would go backwards.
VERSION_MEMORY = 50_000
IDLE_POLL_SECONDS = 1.0
# Reads woken by NOTIFY come at least this share of a tick apart (measured: a tenth gave 500 streams
# a p99 lag of 124 ms at 150 events/s on 2 CPUs, a quarter 83 ms; bench/events.py).
COALESCE = 0.25

EVENTS_READ = Counter("fatura_event_feed_events_total", "Job events the feed read and fanned out")
GAPS_SKIPPED = Counter(
    "fatura_event_feed_gaps_skipped_total",
    "Event numbers the feed stopped waiting for after two minutes (a transaction held them that long)",
)
OUT_OF_ORDER = Counter(
    "fatura_event_feed_out_of_order_total", "Events dropped because their job's stream had a newer version"
)
RECONNECTS = Counter("fatura_event_feed_reconnects_total", "Times the feed's reader lost PostgreSQL")


class EventFeed:
    """The process's single reader of the job event log; see the module's docstring."""

    def __init__(
        self,
        common: CommonSettings,
        settings: EventSettings,
        pool: AsyncPool,
        *,
        name: str,
        db_role: str | None = None,
    ) -> None:
        self.settings = settings
        self._common = common
        self._pool = pool
        self._name = name
        self._db_role = db_role
        self._watermark: Watermark | None = None
        self._by_tenant: dict[uuid.UUID, set[Subscription]] = {}
        self._by_job: dict[uuid.UUID, set[Subscription]] = {}
        self._subscriptions: set[Subscription] = set()
        self._versions: OrderedDict[uuid.UUID, int] = OrderedDict()
        self._ready = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def watermark(self) -> int | None:
        """Every event up to here has been handed to the streams (None until the first read)."""
        return self._watermark.through if self._watermark is not None else None

    @property
    def open_streams(self) -> int:
        return len(self._subscriptions)

    async def start(self) -> None:
        """Start reading; returns at once (the database may not be answering yet)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"event-feed-{self._name}")

    def end_streams(self) -> None:
        """End every open stream with ``End('shutdown')``: the server is going away."""
        for subscription in list(self._subscriptions):
            subscription.end("shutdown", "The server is shutting down; reconnect with Last-Event-ID.")

    async def stop(self) -> None:
        """End every open stream and stop reading."""
        self.end_streams()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def subscribe(
        self, tenant_id: uuid.UUID, *, job_id: uuid.UUID | None = None, last_seq: int | None = None
    ) -> Subscription:
        """A stream of the tenant's events (or one job's, which must be the tenant's: else
        ``NotFound``), after ``last_seq`` when given. Raises ``Unavailable`` while the feed cannot
        read the database, and psycopg's errors when the stream's first read fails."""
        try:
            async with asyncio.timeout(5.0):
                await self._ready.wait()
        except TimeoutError:
            raise Unavailable(
                "the event feed cannot read the database yet; retry after 5 seconds",
                code="event_feed_unavailable",
                headers={"Retry-After": "5"},
            ) from None
        floor = self.watermark or 0
        subscription = Subscription(
            tenant_id,
            job_id,
            cursor=floor if last_seq is None else last_seq,
            floor=floor if last_seq is None else max(floor, last_seq),
            snapshot="no_cursor" if last_seq is None else None,
            buffer=self.settings.subscriber_buffer,
            fetch=self._fetch,
            release=self._unregister,
        )
        self._register(subscription)
        try:
            await subscription.prepare()
        except BaseException:
            subscription.close()
            raise
        return subscription

    # ---------------------------------------------------------------- subscriptions

    def _register(self, subscription: Subscription) -> None:
        self._subscriptions.add(subscription)
        if subscription.job_id is None:
            self._by_tenant.setdefault(subscription.tenant_id, set()).add(subscription)
        else:
            self._by_job.setdefault(subscription.job_id, set()).add(subscription)

    def _unregister(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)
        index, key = (
            (self._by_tenant, subscription.tenant_id)
            if subscription.job_id is None
            else (self._by_job, subscription.job_id)
        )
        subscribers = index.get(key)
        if subscribers is not None:
            subscribers.discard(subscription)
            if not subscribers:
                del index[key]

    async def _fetch(self, query: str, params: dict[str, Any]) -> list[DictRow]:
        async with self._pool.connection() as conn:
            return await (await conn.execute(query, params)).fetchall()

    # ---------------------------------------------------------------- the reader

    async def _run(self) -> None:
        failures = 0
        while True:
            conn: psycopg.AsyncConnection[DictRow] | None = None
            try:
                conn = await async_connect(
                    self._common,
                    autocommit=True,
                    role="edge",
                    name=f"{self._name}-feed",
                    db_role=self._db_role,
                )
                await conn.execute(Q["listen"])
                if self._watermark is None:
                    row = await (await conn.execute(Q["newest"])).fetchone()
                    self._watermark = Watermark(max(0, int(row["newest"] if row else 0) - LOOKBACK))
                while True:
                    await self._read(conn)
                    self._ready.set()
                    failures = 0
                    await self._wait(conn)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                # The reader never gives up: a dependency blip is weather (DESIGN §5.12). Streams stay
                # open; the next read resumes at the watermark, so none of them loses an event.
                failures += 1
                RECONNECTS.inc()
                delay = random.uniform(0, min(5.0, 0.2 * 2**failures))
                if isinstance(exc, psycopg.Error):
                    log.warning("event feed lost the database (%s); reconnecting in %.1fs", exc, delay)
                else:
                    log.exception("event feed failed unexpectedly; restarting in %.1fs", delay)
                await asyncio.sleep(delay)
            finally:
                if conn is not None:
                    await conn.close()

    async def _wait(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """Until a wake-up or the next tick while streams are open (or a gap holds events back
        from them): every ``poll_seconds``, a burst of wake-ups read at most once per quarter tick;
        each read with news wakes every stream it concerns, and under a stream of commits fewer,
        fuller batches cost the edge less CPU (and lag) than one per commit.

        With no stream open, nobody waits for an event: the reader only keeps its watermark near
        the head, every ``IDLE_POLL_SECONDS`` whatever the wake-ups, and ends the wait early when a
        stream opens. (An edge taking a burst of submissions read every commit's events a few dozen
        times a second before, for no one.)"""
        assert self._watermark is not None
        poll = self.settings.poll_seconds
        started = time.monotonic()
        while True:
            woken = False
            # Run to its end (it stops after one): leaving it early would keep the connection locked.
            async for _ in conn.notifies(timeout=poll, stop_after=1):
                woken = True
            if self._subscriptions:
                if woken:
                    await self._space(started)
                    return
                if self._watermark.waiting:
                    return
            if time.monotonic() - started >= IDLE_POLL_SECONDS:
                return

    async def _space(self, started: float) -> None:
        spacing = self.settings.poll_seconds * COALESCE - (time.monotonic() - started)
        if spacing > 0:
            await asyncio.sleep(spacing)

    async def _read(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """Read and fan out everything the watermark allows, a page at a time."""
        watermark = self._watermark
        assert watermark is not None
        while True:
            # With no stream open only the numbers are read: they move the watermark, and nobody
            # would be handed the events.
            whole = bool(self._subscriptions)
            query = Q["poll"] if whole else Q["poll_seqs"]
            rows = await (await conn.execute(query, {"after": watermark.through, "limit": PAGE})).fetchall()
            if not whole and self._subscriptions:
                # A stream opened during the read, at the watermark below these: read them whole.
                continue
            found = [row for row in rows if row["seq"] is not None]
            advance = watermark.advance(
                [row["seq"] for row in found],
                xmin=int(rows[0]["xmin"]),
                xmax=int(rows[0]["xmax"]),
                now=time.monotonic(),
            )
            if advance.skipped:
                GAPS_SKIPPED.inc(advance.skipped)
                log.warning("gave up waiting for %d missing job event number(s)", advance.skipped)
            self._fan_out(found[: advance.deliver])
            if len(found) < PAGE or advance.deliver < len(found):
                return

    def _fan_out(self, rows: Sequence[DictRow]) -> None:
        EVENTS_READ.inc(len(rows))
        if not self._subscriptions:
            # Nobody to hand them to (an edge taking submissions, no stream open): a stream opened
            # later starts at the watermark, past these, from its snapshot or its replay.
            return
        for row in rows:
            event = JobEvent.from_row(row)
            if not self._in_order(event):
                continue
            for subscription in self._by_tenant.get(event.tenant_id, ()):
                subscription.push(event)
            for subscription in self._by_job.get(event.job_id, ()):
                subscription.push(event)

    def _in_order(self, event: JobEvent) -> bool:
        """A job's version never goes backwards on any stream of this process."""
        known = self._versions.get(event.job_id)
        if known is not None and event.state_version < known:
            OUT_OF_ORDER.inc()
            return False
        self._versions[event.job_id] = event.state_version
        self._versions.move_to_end(event.job_id)
        if len(self._versions) > VERSION_MEMORY:
            self._versions.popitem(last=False)
        return True
