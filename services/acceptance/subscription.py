"""One open event stream (``Subscription``): its snapshot, its catch-up from the database and its live
events from the feed, in seq order, each at most once.

A stream remembers the last seq it passed on. Below the feed's watermark at the time it opened (or
at the time it fell its buffer behind) it reads from the database, a page at a time, beside the
pruned horizon; above it, it takes what the feed hands it. While a snapshot may show a job newer
than an event still to come, that event is not sent: a job's version never goes backwards.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client import Counter, Gauge
from psycopg.rows import DictRow
from psycopg_pool import PoolTimeout

from services.acceptance.feed_items import End, FeedItem, JobEvent, Snapshot, SnapshotJob
from services.common import states
from services.common.api.errors import ApiError, NotFound
from services.common.queries import load_queries

log = logging.getLogger(__name__)
Q = load_queries(Path(__file__).with_name("sql") / "feed.sql")

# Rows per catch-up read.
PAGE = 1000
# Jobs a tenant's snapshot lists (unfinished ones, newest first).
SNAPSHOT_JOBS = 1000
_UNFINISHED = sorted(states.NON_TERMINAL | states.AWAITING_REVIEW)

STREAMS_OPEN = Gauge(
    "fatura_event_streams_open", "Event streams (SSE, Watch) open now", multiprocess_mode="livesum"
)
STREAMS_ENDED = Counter("fatura_event_streams_ended_total", "Event streams the server ended", ["reason"])
CATCH_UPS = Counter(
    "fatura_event_stream_catch_ups_total",
    "Times a stream fell a buffer behind and caught up from the database instead",
)

Fetch = Callable[[str, dict[str, Any]], Awaitable[list[DictRow]]]


class Subscription:
    """One open stream: a tenant's events, or one job's. Made by ``EventFeed.subscribe``."""

    def __init__(
        self,
        tenant_id: uuid.UUID,
        job_id: uuid.UUID | None,
        *,
        cursor: int,
        floor: int,
        snapshot: str | None,
        buffer: int,
        fetch: Fetch,
        release: Callable[[Subscription], None],
    ) -> None:
        """``fetch`` runs one named query on the database; ``release`` tells the feed the stream is
        gone. The feed makes subscriptions (``EventFeed.subscribe``)."""
        self.tenant_id = tenant_id
        self.job_id = job_id
        self._buffer = buffer
        self._fetch = fetch
        self._release = release
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
        STREAMS_OPEN.inc()

    # ---------------------------------------------------------------- called by the feed

    def push(self, event: JobEvent) -> None:
        """A live event of this stream's tenant or job, in seq order."""
        if event.seq <= self._upto or self._end is not None:
            return
        if len(self._queue) >= self._buffer:
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
            self._release(self)
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

    async def prepare(self) -> None:
        """Read what the stream starts with now, so a database error or another tenant's job is the
        request's answer rather than a broken stream."""
        if self._pending_snapshot is not None:
            self._prepared = [await self._snapshot(self._pending_snapshot, self._cursor)]
            return
        if self.job_id is not None:
            if not await self._fetch(Q["find_job"], {"tenant_id": self.tenant_id, "job_id": self.job_id}):
                raise job_not_found()
        if self._cursor < self._upto:
            self._prepared = await self._catch_up()
            return
        # A cursor at or past the feed's watermark needs no catch-up, but what came after it may
        # already be pruned (a client back after the retention, on a quiet system).
        row = (await self._fetch(Q["horizon"], {}))[0]
        if self._cursor > int(row["newest"]):
            raise ApiError(
                f"Last-Event-ID {self._cursor} is above every event this server has sent; resume from "
                "an id it sent, or connect without one",
                code="invalid_last_event_id",
            )
        if int(row["pruned_through"]) > self._cursor:
            self._prepared = [await self._snapshot("cursor_expired", int(row["pruned_through"]))]

    async def _snapshot(self, reason: str, resume: int) -> Snapshot:
        params = {
            "tenant_id": self.tenant_id,
            "job_id": self.job_id,
            "states": _UNFINISHED,
            "limit": SNAPSHOT_JOBS + 1,
        }
        query = Q["snapshot_job"] if self.job_id is not None else Q["snapshot_tenant"]
        rows = await self._fetch(query, params)
        if self.job_id is not None and rows[0]["job_id"] is None:
            raise job_not_found()
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
        rows = await self._fetch(query, params)
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


def job_not_found() -> NotFound:
    return NotFound("no such extraction job for this tenant", code="job_not_found")
