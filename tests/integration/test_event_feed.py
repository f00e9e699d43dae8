"""The job event feed in-process against the real PostgreSQL: events go out in seq order, and a seq
that commits after a higher one is waited for, never skipped."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.rows import dict_row

import services.acceptance.feed as feed_module
from fix_db import MakeTenant, SyncPool
from fix_events import CHANGE, change_state, new_job
from fix_pipeline import wait_until
from services.acceptance.feed import EventFeed, FeedItem, JobEvent, Snapshot, Subscription
from services.acceptance.settings import EventSettings
from services.common.db import async_pool
from services.common.settings import CommonSettings
from services.common.uow import RECORD_JOB_EVENT, JobChange

T = TypeVar("T")
SETTINGS = EventSettings(poll_seconds=0.05, heartbeat_seconds=0.2)


def run_with_feed(common: CommonSettings, body: Callable[[EventFeed], Awaitable[T]]) -> T:
    async def main() -> T:
        pool = async_pool(common, name="feed-test", max_size=2, autocommit=True)
        await pool.open()
        feed = EventFeed(common, SETTINGS, pool, name="feed-test")
        await feed.start()
        try:
            return await body(feed)
        finally:
            await feed.stop()
            await pool.close()

    return asyncio.run(main())


async def collect(subscription: Subscription, count: int, timeout: float = 10.0) -> list[FeedItem]:
    items: list[FeedItem] = []
    async with asyncio.timeout(timeout):
        async for batch in subscription.batches(heartbeat=0.2):
            items.extend(batch)
            if len(items) >= count:
                return items
    return items


async def quiet_for(subscription: Subscription, seconds: float) -> list[FeedItem]:
    """What arrives within ``seconds`` (heartbeats are empty batches)."""
    items: list[FeedItem] = []
    try:
        async with asyncio.timeout(seconds):
            async for batch in subscription.batches(heartbeat=0.1):
                items.extend(batch)
    except TimeoutError:
        pass
    return items


def open_change(
    database_url: str, tenant_id: uuid.UUID, job_id: uuid.UUID, state: str
) -> psycopg.Connection[Any]:
    """A state change whose transaction has taken its event's seq and is still open."""
    conn = psycopg.connect(database_url, row_factory=dict_row)
    row = conn.execute(CHANGE, {"state": state, "job_id": job_id}).fetchone()
    assert row is not None
    conn.execute(RECORD_JOB_EVENT, JobChange(tenant_id, job_id, state, row["state_version"], None).params())
    return conn


def test_events_of_the_tenants_jobs_go_out_in_seq_order_after_a_snapshot(
    common_settings: CommonSettings, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant, other = make_tenant(), make_tenant()

    async def body(feed: EventFeed) -> list[FeedItem]:
        while feed.watermark is None:
            await asyncio.sleep(0.02)
        async with await feed.subscribe(tenant.id) as subscription:
            job = await asyncio.to_thread(new_job, pool, tenant.id)
            await asyncio.to_thread(new_job, pool, other.id)
            await asyncio.to_thread(change_state, pool, tenant.id, job, "RUNNING")
            await asyncio.to_thread(change_state, pool, tenant.id, job, "SUCCEEDED")
            return await collect(subscription, 4)

    items = run_with_feed(common_settings, body)
    assert isinstance(items[0], Snapshot) and items[0].reason == "no_cursor"
    events = [i for i in items[1:] if isinstance(i, JobEvent)]
    assert [(e.state, e.state_version) for e in events] == [("READY", 1), ("RUNNING", 2), ("SUCCEEDED", 3)]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert {e.tenant_id for e in events} == {tenant.id}


def test_a_lower_seq_that_commits_late_is_waited_for_and_not_skipped(
    common_settings: CommonSettings, database_url: str, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()
    first, second = new_job(pool, tenant.id), new_job(pool, tenant.id)

    async def body(feed: EventFeed) -> tuple[list[FeedItem], list[FeedItem], list[int]]:
        async with await feed.subscribe(tenant.id) as subscription:
            await collect(subscription, 1)  # the snapshot
            # Given a transaction that took the lower seq and has not committed
            slow = await asyncio.to_thread(open_change, database_url, tenant.id, first, "RUNNING")
            try:
                # When a later transaction takes the next seq and commits first
                await asyncio.to_thread(change_state, pool, tenant.id, second, "RUNNING")
                # Then nothing goes out while the lower one may still commit
                early = await quiet_for(subscription, 1.0)
                await asyncio.to_thread(slow.commit)
            finally:
                await asyncio.to_thread(slow.close)
            # And once it has, both go out, the lower first
            late = await collect(subscription, 2)
            seqs = [(await asyncio.to_thread(_seq_of, pool, job, 2)) for job in (first, second)]
        return early, late, seqs

    early, late, seqs = run_with_feed(common_settings, body)
    assert early == []
    assert seqs[0] < seqs[1]
    assert [(e.job_id, e.seq) for e in late if isinstance(e, JobEvent)] == [
        (first, seqs[0]),
        (second, seqs[1]),
    ]


def test_a_rolled_back_seq_holds_later_events_only_briefly(
    common_settings: CommonSettings, database_url: str, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()
    first, second = new_job(pool, tenant.id), new_job(pool, tenant.id)

    async def body(feed: EventFeed) -> tuple[list[FeedItem], float]:
        async with await feed.subscribe(tenant.id) as subscription:
            await collect(subscription, 1)
            doomed = await asyncio.to_thread(open_change, database_url, tenant.id, first, "RUNNING")
            await asyncio.to_thread(change_state, pool, tenant.id, second, "RUNNING")
            await asyncio.to_thread(doomed.rollback)
            await asyncio.to_thread(doomed.close)
            started = time.monotonic()
            items = await collect(subscription, 1)
            return items, time.monotonic() - started

    items, waited = run_with_feed(common_settings, body)
    assert [(e.job_id, e.state) for e in items if isinstance(e, JobEvent)] == [(second, "RUNNING")]
    assert waited < 2.0


def _seq_of(pool: SyncPool, job_id: uuid.UUID, version: int) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT seq FROM job_events WHERE job_id = %s AND state_version = %s", (job_id, version)
        ).fetchone()
    assert row is not None
    return int(row["seq"])


def test_a_stream_that_falls_a_buffer_behind_catches_up_from_the_database(
    common_settings: CommonSettings, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()

    async def main() -> list[FeedItem]:
        apool = async_pool(common_settings, name="feed-test", max_size=2, autocommit=True)
        await apool.open()
        feed = EventFeed(
            common_settings, EventSettings(poll_seconds=0.05, subscriber_buffer=2), apool, name="t"
        )
        await feed.start()
        try:
            async with await feed.subscribe(tenant.id) as subscription:
                await collect(subscription, 1)
                # Given a client that reads nothing while seven events arrive (its buffer holds two)
                jobs = [await asyncio.to_thread(new_job, pool, tenant.id) for _ in range(3)]
                for job in jobs[:2]:
                    await asyncio.to_thread(change_state, pool, tenant.id, job, "RUNNING")
                    await asyncio.to_thread(change_state, pool, tenant.id, job, "SUCCEEDED")
                await asyncio.sleep(0.5)
                # Then what it reads next is every one of them, in order
                return await collect(subscription, 7)
        finally:
            await feed.stop()
            await apool.close()

    items = asyncio.run(main())
    seqs = [i.seq for i in items if isinstance(i, JobEvent)]
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT seq FROM job_events WHERE tenant_id = %s ORDER BY seq", (tenant.id,)
        ).fetchall()
    assert seqs == [int(r["seq"]) for r in rows]


def test_an_event_older_than_one_already_sent_for_its_job_is_not_sent(
    common_settings: CommonSettings, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()
    job = new_job(pool, tenant.id)

    async def body(feed: EventFeed) -> list[FeedItem]:
        async with await feed.subscribe(tenant.id) as subscription:
            await collect(subscription, 1)  # the snapshot: READY, version 1
            await asyncio.to_thread(change_state, pool, tenant.id, job, "RUNNING")
            await asyncio.to_thread(change_state, pool, tenant.id, job, "SUCCEEDED")
            # A note on the job's history recorded at a version it has already left (a writer that
            # read the job before its last change committed)
            await asyncio.to_thread(_stale_note, pool, tenant.id, job)
            await asyncio.to_thread(_current_note, pool, tenant.id, job)
            items = await collect(subscription, 3)
            return items + await quiet_for(subscription, 0.5)

    items = run_with_feed(common_settings, body)
    events = [(i.state_version, i.kind) for i in items if isinstance(i, JobEvent)]
    assert events == [(2, "state"), (3, "state"), (3, "review")]


def _stale_note(pool: SyncPool, tenant_id: uuid.UUID, job_id: uuid.UUID) -> None:
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO job_events (tenant_id, job_id, state, state_version, kind)
               VALUES (%s, %s, 'RUNNING', 2, 'review')""",
            (tenant_id, job_id),
        )


def _current_note(pool: SyncPool, tenant_id: uuid.UUID, job_id: uuid.UUID) -> None:
    """A note at the job's current version: it goes out (same version, not a state change)."""
    with pool.connection() as conn:
        conn.execute(
            """INSERT INTO job_events (tenant_id, job_id, state, state_version, kind)
               VALUES (%s, %s, 'SUCCEEDED', 3, 'review')""",
            (tenant_id, job_id),
        )


class CountingFeed(EventFeed):
    """The feed, counting its reads of the event log."""

    reads = 0

    async def _read(self, conn: Any) -> None:
        self.reads += 1
        await super()._read(conn)


def test_with_no_stream_open_wake_ups_do_not_make_the_feed_read_the_log(
    common_settings: CommonSettings, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    tenant = make_tenant()

    async def main() -> tuple[int, list[FeedItem]]:
        apool = async_pool(common_settings, name="feed-test", max_size=2, autocommit=True)
        await apool.open()
        feed = CountingFeed(common_settings, SETTINGS, apool, name="feed-test")
        await feed.start()
        try:
            (await feed.subscribe(tenant.id)).close()  # waits for the first read
            before = feed.reads
            # Given no stream open, when 30 commits each wake the feed over about 1.5 s
            jobs = []
            for _ in range(30):
                jobs.append(await asyncio.to_thread(new_job, pool, tenant.id))
                await asyncio.to_thread(_notify, pool)
                await asyncio.sleep(0.05)
            idle_reads = feed.reads - before
            # Then a stream opened afterwards still gets their next events
            async with await feed.subscribe(tenant.id) as subscription:
                await collect(subscription, 1)  # the snapshot
                await asyncio.to_thread(change_state, pool, tenant.id, jobs[-1], "RUNNING")
                items = await collect(subscription, 1)
            return idle_reads, items
        finally:
            await feed.stop()
            await apool.close()

    idle_reads, items = asyncio.run(main())
    # It read on its idle tick (once a second), not once per wake-up (every 0.0125 s at most)
    assert idle_reads <= 3
    assert [(e.state, e.state_version) for e in items if isinstance(e, JobEvent)] == [("RUNNING", 2)]


def test_a_stream_opening_during_a_read_made_for_no_one_still_gets_its_events(
    common_settings: CommonSettings, pool: SyncPool, make_tenant: MakeTenant, monkeypatch: Any
) -> None:
    tenant = make_tenant()
    job = new_job(pool, tenant.id)
    cursor = _seq_of(pool, job, 1)
    # The read made with no stream open waits on an advisory lock the test holds
    key = uuid.uuid4().int % 2**62
    blocked = feed_module.Q["poll_seqs"].replace(
        "AS xmax) s", f"AS xmax, pg_advisory_xact_lock_shared({key}) AS held) s"
    )
    assert blocked != feed_module.Q["poll_seqs"]
    monkeypatch.setitem(feed_module.Q, "poll_seqs", blocked)

    async def body(feed: EventFeed) -> list[FeedItem]:
        (await feed.subscribe(tenant.id)).close()  # waits for the first read
        with pool.connection() as lock:
            with lock.transaction():
                lock.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
                # Given three events committed while no stream is open
                for state in ("RUNNING", "RETRY_SCHEDULED", "RUNNING"):
                    await asyncio.to_thread(change_state, pool, tenant.id, job, state)
                # And the feed's next read (with their numbers only) under way
                await asyncio.to_thread(
                    wait_until, lambda: _waits_for_advisory_lock(pool, key), 10.0, "the feed's read waiting"
                )
                # When a stream opens from before them, while that read is under way
                subscription = await feed.subscribe(tenant.id, last_seq=cursor)
        # Then once the read ends, the stream gets all three
        async with subscription:
            return await collect(subscription, 3)

    items = run_with_feed(common_settings, body)
    assert [(e.state, e.state_version) for e in items if isinstance(e, JobEvent)] == [
        ("RUNNING", 2),
        ("RETRY_SCHEDULED", 3),
        ("RUNNING", 4),
    ]


def _notify(pool: SyncPool) -> None:
    with pool.connection() as conn:
        conn.execute("SELECT pg_notify('fatura_outbox', '')")


def _waits_for_advisory_lock(pool: SyncPool, key: int) -> bool:
    """A session waits for the advisory lock ``key``."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            " AND (classid::bigint << 32 | objid::bigint) = %s",
            (key,),
        ).fetchone()
    return row is not None and row["n"] > 0
