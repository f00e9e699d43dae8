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
import json
import logging
import random
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import Counter, Gauge
from psycopg.rows import DictRow
from psycopg_pool import PoolTimeout

from services.acceptance.settings import EventSettings
from services.acceptance.views import status_url
from services.acceptance.watermark import Watermark
from services.common import states
from services.common.api.errors import NotFound, Unavailable
from services.common.db import AsyncPool, async_connect
from services.common.queries import load_queries
from services.common.settings import CommonSettings

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "feed.sql")

# Rows per read, for the feed and for a stream's catch-up.
PAGE = 1000
# The feed starts this far below the newest event, so one still committing below it is not missed.
LOOKBACK = 1000
# Jobs a tenant's snapshot lists (unfinished ones, newest first).
SNAPSHOT_JOBS = 1000
# Jobs whose last delivered version the feed remembers, to drop an event that would go backwards.
VERSION_MEMORY = 50_000
IDLE_POLL_SECONDS = 1.0
_UNFINISHED = sorted(states.NON_TERMINAL | states.AWAITING_REVIEW)

STREAMS_OPEN = Gauge(
    "fatura_event_streams_open", "Event streams (SSE, Watch) open now", multiprocess_mode="livesum"
)
STREAMS_ENDED = Counter("fatura_event_streams_ended_total", "Event streams the server ended", ["reason"])
EVENTS_READ = Counter("fatura_event_feed_events_total", "Job events the feed read and fanned out")
CATCH_UPS = Counter(
    "fatura_event_stream_catch_ups_total",
    "Times a stream fell a buffer behind and caught up from the database instead",
)
GAPS_SKIPPED = Counter(
    "fatura_event_feed_gaps_skipped_total",
    "Event numbers the feed stopped waiting for after two minutes (a transaction held them that long)",
)
OUT_OF_ORDER = Counter(
    "fatura_event_feed_out_of_order_total", "Events dropped because their job's stream had a newer version"
)
RECONNECTS = Counter("fatura_event_feed_reconnects_total", "Times the feed's reader lost PostgreSQL")


@dataclass(frozen=True, slots=True)
class JobEvent:
    """One row of the job event log, as every stream sends it."""

    seq: int
    tenant_id: uuid.UUID
    job_id: uuid.UUID
    state: str
    state_version: int
    kind: str  # 'state' | 'review' | 'erp_ack'
    at: datetime
    data: bytes = field(repr=False, compare=False)  # the JSON body, encoded once for every stream

    @classmethod
    def from_row(cls, row: DictRow) -> JobEvent:
        body = {
            "seq": row["seq"],
            "job_id": str(row["job_id"]),
            "state": row["state"],
            "state_version": row["state_version"],
            "kind": row["kind"],
            "at": row["at"].isoformat(),
            "done": states.is_done(row["state"]),
            "status_url": status_url(row["job_id"]),
        }
        return cls(
            seq=row["seq"],
            tenant_id=row["tenant_id"],
            job_id=row["job_id"],
            state=row["state"],
            state_version=row["state_version"],
            kind=row["kind"],
            at=row["at"],
            data=json.dumps(body, separators=(",", ":")).encode(),
        )


@dataclass(frozen=True)
class SnapshotJob:
    job_id: uuid.UUID
    state: str
    state_version: int

    def body(self) -> dict[str, Any]:
        return {
            "job_id": str(self.job_id),
            "state": self.state,
            "state_version": self.state_version,
            "done": states.is_done(self.state),
            "status_url": status_url(self.job_id),
        }


@dataclass(frozen=True)
class Snapshot:
    """The stream's jobs as they are now, sent first when there is no cursor to resume from
    (``reason`` ``no_cursor``) or when the events after it were pruned (``cursor_expired``).
    ``seq`` is where the stream goes on from: a client resuming from it gets no second snapshot."""

    seq: int
    reason: str
    jobs: tuple[SnapshotJob, ...]
    truncated: bool
    job_stream: bool

    def body(self) -> dict[str, Any]:
        if self.job_stream:
            message = "The job as it is now; its later events follow."
        else:
            message = "Your unfinished jobs as they are now; later events follow."
            if self.reason == "cursor_expired":
                message += (
                    " Events before this point were deleted after their retention: a job that finished"
                    " meanwhile is not listed; GET /v1/extraction-jobs lists every job."
                )
            if self.truncated:
                message += f" Only the newest {len(self.jobs)} are listed; GET /v1/extraction-jobs lists all."
        return {
            "type": "snapshot",
            "reason": self.reason,
            "seq": self.seq,
            "jobs": [job.body() for job in self.jobs],
            "truncated": self.truncated,
            "message": message,
        }


@dataclass(frozen=True)
class End:
    """The server ended the stream; always the last item."""

    reason: str  # 'key_revoked' | 'shutdown'
    message: str

    def body(self) -> dict[str, Any]:
        return {"type": "end", "reason": self.reason, "message": self.message}


FeedItem = JobEvent | Snapshot | End


class Subscription:
    """One open stream: a tenant's events, or one job's. Made by ``EventFeed.subscribe``."""

    def __init__(
        self,
        feed: EventFeed,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID | None,
        *,
        cursor: int,
        floor: int,
        snapshot: str | None,
    ) -> None:
        self.tenant_id = tenant_id
        self.job_id = job_id
        self._feed = feed
        # The last seq this stream has passed on; live events at or below it are not sent.
        self._cursor = cursor
        # Events up to here come from the database; live ones above it are queued meanwhile.
        self._upto = floor
        self._queue: deque[JobEvent] = deque()
        self._wake = asyncio.Event()
        self._pending_snapshot = snapshot
        self._prepared: list[FeedItem] = []
        # While a snapshot may show a job newer than an event still to come: job -> version shown.
        self._shown: dict[uuid.UUID, int] | None = None
        self._shown_until = 0
        self._end: End | None = None
        self._closed = False

    # ---------------------------------------------------------------- called by the feed

    def _push(self, event: JobEvent) -> None:
        if event.seq <= self._upto or self._end is not None:
            return
        if len(self._queue) >= self._feed.settings.subscriber_buffer:
            # Too slow for live delivery: drop the queue and read this stretch from the database.
            CATCH_UPS.inc()
            self._queue.clear()
            self._upto = event.seq
        else:
            self._queue.append(event)
        self._wake.set()

    # ---------------------------------------------------------------- the stream's public side

    def end(self, reason: str, message: str) -> None:
        """End the stream: its next batch ends with ``End(reason, message)``."""
        if self._end is None:
            self._end = End(reason, message)
            STREAMS_ENDED.labels(reason).inc()
            self._wake.set()

    def close(self) -> None:
        """Release the stream (idempotent): the feed stops handing it events."""
        if not self._closed:
            self._closed = True
            self._feed._unregister(self)
            STREAMS_OPEN.dec()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def batches(self, heartbeat: float) -> AsyncIterator[list[FeedItem]]:
        """What to send, in order; an empty batch after ``heartbeat`` seconds with nothing to send.
        Ends after the batch that ends with ``End``."""
        failures = 0
        while True:
            if self._end is not None:
                yield [self._end]
                return
            try:
                batch = await self._next(heartbeat)
                failures = 0
            except (psycopg.OperationalError, psycopg.errors.QueryCanceled, PoolTimeout) as exc:
                # Catching up reads the database; while it is away the stream stays open and waits.
                failures += 1
                log.warning("an event stream could not read the database (%s); retrying", exc)
                await asyncio.sleep(random.uniform(0, min(5.0, 0.2 * 2**failures)))
                batch = []
            if batch is not None:
                yield batch

    async def _next(self, heartbeat: float) -> list[FeedItem] | None:
        """The next batch; [] when ``heartbeat`` passed quietly; None when there is nothing to send
        yet but something to do first (end, or catch up)."""
        if self._prepared:
            batch, self._prepared = self._prepared, []
            return batch
        if self._pending_snapshot is not None:
            return [await self._snapshot(self._pending_snapshot, self._cursor)]
        if self._cursor < self._upto:
            return await self._catch_up()
        if not self._queue:
            self._wake.clear()
            try:
                async with asyncio.timeout(heartbeat):
                    await self._wake.wait()
            except TimeoutError:
                return []
            if self._end is not None or self._cursor < self._upto:
                return None
        events: list[FeedItem] = [e for e in self._queue if self._fresh(e)]
        self._queue.clear()
        return events if events else None

    async def _prepare(self) -> None:
        """Read what the stream starts with now, so a database error or another tenant's job is the
        request's answer rather than a broken stream."""
        if self._pending_snapshot is not None:
            self._prepared = [await self._snapshot(self._pending_snapshot, self._cursor)]
            return
        if self.job_id is not None:
            await self._feed._require_job(self.tenant_id, self.job_id)
        if self._cursor < self._upto:
            self._prepared = await self._catch_up()

    async def _snapshot(self, reason: str, resume: int) -> Snapshot:
        params = {
            "tenant_id": self.tenant_id,
            "job_id": self.job_id,
            "states": _UNFINISHED,
            "limit": SNAPSHOT_JOBS + 1,
        }
        query = Q["snapshot_job"] if self.job_id is not None else Q["snapshot_tenant"]
        rows = await self._feed._fetch(query, params)
        if self.job_id is not None and rows[0]["job_id"] is None:
            raise _job_not_found()
        jobs = [SnapshotJob(r["job_id"], r["state"], r["state_version"]) for r in rows if r["job_id"]]
        self._shown = {job.job_id: job.state_version for job in jobs[:SNAPSHOT_JOBS]}
        self._shown_until = int(rows[0]["newest"])
        self._cursor = max(self._cursor, resume)
        self._pending_snapshot = None
        return Snapshot(
            seq=self._cursor,
            reason=reason,
            jobs=tuple(jobs[:SNAPSHOT_JOBS]),
            truncated=len(jobs) > SNAPSHOT_JOBS,
            job_stream=self.job_id is not None,
        )

    async def _catch_up(self) -> list[FeedItem]:
        params = {
            "tenant_id": self.tenant_id,
            "job_id": self.job_id,
            "after": self._cursor,
            "upto": self._upto,
            "limit": PAGE,
        }
        query = Q["replay_job"] if self.job_id is not None else Q["replay_tenant"]
        rows = await self._feed._fetch(query, params)
        horizon = int(rows[0]["pruned_through"])
        if horizon > self._cursor:
            # What this stream missed was partly pruned: the jobs as they are now, then the rest.
            return [await self._snapshot("cursor_expired", horizon)]
        read = [JobEvent.from_row(r) for r in rows if r["seq"] is not None]
        events: list[FeedItem] = [e for e in read if self._fresh(e)]
        self._cursor = read[-1].seq if len(read) == PAGE else self._upto
        return events

    def _fresh(self, event: JobEvent) -> bool:
        """Not sent before, and no older than what a snapshot already showed; moves the cursor."""
        if event.seq <= self._cursor:
            return False
        self._cursor = event.seq
        if self._shown is not None:
            if event.seq > self._shown_until:
                self._shown = None
            else:
                shown = self._shown.get(event.job_id)
                if shown is not None and (
                    event.state_version < shown or (event.state_version == shown and event.kind == "state")
                ):
                    return False
        return True


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

    async def stop(self) -> None:
        """End every open stream (``End('shutdown')``) and stop reading."""
        for subscription in list(self._subscriptions):
            subscription.end("shutdown", "The server is shutting down; reconnect with Last-Event-ID.")
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
        if last_seq is None:
            subscription = Subscription(
                self, tenant_id, job_id, cursor=floor, floor=floor, snapshot="no_cursor"
            )
        else:
            subscription = Subscription(
                self, tenant_id, job_id, cursor=last_seq, floor=max(floor, last_seq), snapshot=None
            )
        self._register(subscription)
        try:
            await subscription._prepare()
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
        STREAMS_OPEN.inc()

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

    async def _require_job(self, tenant_id: uuid.UUID, job_id: uuid.UUID) -> None:
        if not await self._fetch(Q["find_job"], {"tenant_id": tenant_id, "job_id": job_id}):
            raise _job_not_found()

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
        """Until a wake-up or the next tick: every ``poll_seconds`` while streams are open (or a gap
        holds events back), every ``IDLE_POLL_SECONDS`` otherwise, ending the idle wait early when a
        stream opens. A burst of wake-ups still reads at most once per tenth of a tick."""
        assert self._watermark is not None
        poll = self.settings.poll_seconds
        started = time.monotonic()
        while True:
            woken = False
            # Run to its end (it stops after one): leaving it early would keep the connection locked.
            async for _ in conn.notifies(timeout=poll, stop_after=1):
                woken = True
            if woken:
                await self._space(started)
                return
            if self._subscriptions or self._watermark.waiting:
                return
            if time.monotonic() - started >= IDLE_POLL_SECONDS:
                return

    async def _space(self, started: float) -> None:
        spacing = self.settings.poll_seconds / 10 - (time.monotonic() - started)
        if spacing > 0:
            await asyncio.sleep(spacing)

    async def _read(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """Read and fan out everything the watermark allows, a page at a time."""
        watermark = self._watermark
        assert watermark is not None
        while True:
            rows = await (
                await conn.execute(Q["poll"], {"after": watermark.through, "limit": PAGE})
            ).fetchall()
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
        for row in rows:
            event = JobEvent.from_row(row)
            EVENTS_READ.inc()
            if not self._in_order(event):
                continue
            for subscription in self._by_tenant.get(event.tenant_id, ()):
                subscription._push(event)
            for subscription in self._by_job.get(event.job_id, ()):
                subscription._push(event)

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


def _job_not_found() -> NotFound:
    return NotFound("no such extraction job for this tenant", code="job_not_found")
