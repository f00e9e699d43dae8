"""SSE from the real edge process over the real PostgreSQL: ``GET /v1/events`` and
``GET /v1/extraction-jobs/{id}/events`` (issue 11, point 2).

The edge here trusts a looked-up key for a minute (``FATURA_AUTH_CACHE_SECONDS``), so a stream that
ends after its key is revoked ends because the stream looks its key up again, not by chance.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_events import SseEvent, change_state, new_job, sse
from fix_processes import ServiceProcess, SpawnFn, start_edge
from services.acceptance.keys import create_key, revoke_key


@pytest.fixture(scope="module")
def stream_edge(spawn: SpawnFn) -> ServiceProcess:
    return start_edge(
        spawn,
        workers=2,
        FATURA_AUTH_CACHE_SECONDS="60",
        FATURA_EVENT_POLL_SECONDS="0.05",
        FATURA_EVENT_HEARTBEAT_SECONDS="0.5",
        FATURA_EVENT_AUTH_RECHECK_SECONDS="0.5",
    )


def url(edge: ServiceProcess) -> str:
    assert edge.base_url is not None
    return edge.base_url


def tenant_seqs(pool: SyncPool, tenant_id: uuid.UUID, after: int = 0) -> list[int]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT seq FROM job_events WHERE tenant_id = %s AND seq > %s ORDER BY seq", (tenant_id, after)
        ).fetchall()
    return [int(r["seq"]) for r in rows]


def is_event_of(job_id: uuid.UUID, state: str) -> Callable[[SseEvent], bool]:
    return lambda e: e.event == "message" and e.data["job_id"] == str(job_id) and e.data["state"] == state


def open_streams(edge: ServiceProcess) -> float:
    text = httpx.get(f"http://127.0.0.1:{edge.env['FATURA_HTTP_METRICS_PORT']}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "fatura_event_streams_open":
            return sum(sample.value for sample in family.samples)
    return 0.0


def test_a_jobs_events_arrive_in_order_with_their_seq_as_id(
    stream_edge: ServiceProcess, pool: SyncPool, tenant: TenantHandle
) -> None:
    job = new_job(pool, tenant.id)
    with sse(url(stream_edge), f"/v1/extraction-jobs/{job}/events", tenant.api_key) as stream:
        assert stream.response.status_code == 200
        assert stream.response.headers["content-type"].startswith("text/event-stream")
        # Without a cursor the stream starts with the job as it is now
        snapshot = stream.next()
        assert snapshot.event == "snapshot" and snapshot.data["reason"] == "no_cursor"
        assert [(j["job_id"], j["state"], j["state_version"]) for j in snapshot.data["jobs"]] == [
            (str(job), "READY", 1)
        ]
        change_state(pool, tenant.id, job, "RUNNING")
        change_state(pool, tenant.id, job, "SUCCEEDED")
        events = stream.take(2)
    assert [(e.data["state"], e.data["state_version"], e.data["done"]) for e in events] == [
        ("RUNNING", 2, False),
        ("SUCCEEDED", 3, True),
    ]
    seqs = tenant_seqs(pool, tenant.id)[1:]
    assert [int(e.id or 0) for e in events] == [e.data["seq"] for e in events] == seqs
    assert events[1].data["status_url"] == f"/v1/extraction-jobs/{job}"
    assert events[1].data["kind"] == "state"


def test_reconnecting_with_last_event_id_replays_exactly_what_was_missed(
    stream_edge: ServiceProcess, pool: SyncPool, tenant: TenantHandle
) -> None:
    first = new_job(pool, tenant.id)
    with sse(url(stream_edge), "/v1/events", tenant.api_key) as stream:
        assert stream.next().event == "snapshot"
        change_state(pool, tenant.id, first, "RUNNING")
        seen = stream.until(is_event_of(first, "RUNNING"))[-1]
    # While the client is away, its jobs move on
    second = new_job(pool, tenant.id)
    change_state(pool, tenant.id, first, "SUCCEEDED")
    change_state(pool, tenant.id, second, "RUNNING")
    missed = tenant_seqs(pool, tenant.id, after=int(seen.id or 0))
    assert len(missed) == 3
    with sse(url(stream_edge), "/v1/events", tenant.api_key, last_event_id=seen.id) as stream:
        replayed = stream.take(3)
        change_state(pool, tenant.id, second, "SUCCEEDED")
        live = stream.next()
    assert [e.event for e in replayed] == ["message"] * 3  # no snapshot: nothing was pruned
    assert [int(e.id or 0) for e in replayed] == missed
    assert [(e.data["job_id"], e.data["state"]) for e in replayed] == [
        (str(second), "READY"),
        (str(first), "SUCCEEDED"),
        (str(second), "RUNNING"),
    ]
    assert (live.data["job_id"], live.data["state"]) == (str(second), "SUCCEEDED")


def test_a_cursor_older_than_the_retention_gets_a_snapshot_first(
    stream_edge: ServiceProcess, pool: SyncPool, tenant: TenantHandle
) -> None:
    job = new_job(pool, tenant.id)
    change_state(pool, tenant.id, job, "RUNNING")
    old_cursor, horizon = tenant_seqs(pool, tenant.id)
    # The relay pruned through the job's RUNNING event (the horizon is moved as pruning moves it)
    with pool.connection() as conn:
        conn.execute("UPDATE job_event_horizon SET pruned_through = greatest(pruned_through, %s)", (horizon,))
    change_state(pool, tenant.id, job, "SUCCEEDED")
    with sse(url(stream_edge), "/v1/events", tenant.api_key, last_event_id=str(old_cursor)) as stream:
        snapshot, after = stream.take(2)
    assert snapshot.event == "snapshot" and snapshot.data["reason"] == "cursor_expired"
    assert int(snapshot.id or 0) >= horizon
    # The snapshot shows the job as it is now; no event older than that follows it
    assert [(j["job_id"], j["state"]) for j in snapshot.data["jobs"]] == []  # SUCCEEDED is finished
    assert (after.data["state"], after.data["state_version"]) == ("SUCCEEDED", 3)


def test_another_tenants_job_is_404_and_the_tenant_stream_shows_only_its_own_jobs(
    stream_edge: ServiceProcess, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    mine, theirs = make_tenant(), make_tenant()
    their_job = new_job(pool, theirs.id)
    with httpx.Client(base_url=url(stream_edge), timeout=10) as client:
        response = client.get(f"/v1/extraction-jobs/{their_job}/events", headers=mine.headers)
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "job_not_found"
        unknown = client.get(f"/v1/extraction-jobs/{uuid.uuid4()}/events", headers=mine.headers)
        assert unknown.status_code == 404
    with sse(url(stream_edge), "/v1/events", mine.api_key) as stream:
        assert stream.next().data["jobs"] == []
        change_state(pool, theirs.id, their_job, "RUNNING")
        my_job = new_job(pool, mine.id)
        change_state(pool, mine.id, my_job, "RUNNING")
        events = stream.until(is_event_of(my_job, "RUNNING"))
    assert {e.data["job_id"] for e in events} == {str(my_job)}


def test_a_revoked_keys_stream_ends_within_seconds_and_says_why(
    stream_edge: ServiceProcess, pool: SyncPool, tenant: TenantHandle
) -> None:
    info, key = create_key(pool, scope="tenant", tenant_id=tenant.id, label="stream")
    with sse(url(stream_edge), "/v1/events", key) as stream:
        assert stream.next().event == "snapshot"
        revoked_at = time.monotonic()
        revoke_key(pool, info.prefix)
        end = stream.next(timeout=5)
        ended_after = time.monotonic() - revoked_at
        with pytest.raises(EOFError):
            stream.next(timeout=5)
    assert end.event == "end" and end.data["reason"] == "key_revoked"
    assert ended_after < 3.0


def test_a_client_that_disconnects_releases_its_stream(
    stream_edge: ServiceProcess, tenant: TenantHandle
) -> None:
    before = open_streams(stream_edge)
    with (
        sse(url(stream_edge), "/v1/events", tenant.api_key) as a,
        sse(url(stream_edge), "/v1/events", tenant.api_key) as b,
    ):
        a.next(), b.next()
        assert open_streams(stream_edge) == before + 2
    deadline = time.monotonic() + 5
    while open_streams(stream_edge) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_streams(stream_edge) == before


def test_a_malformed_last_event_id_or_no_key_is_a_typed_error(
    stream_edge: ServiceProcess, tenant: TenantHandle
) -> None:
    with httpx.Client(base_url=url(stream_edge), timeout=10) as client:
        bad = client.get("/v1/events", headers={**tenant.headers, "Last-Event-ID": "-1"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_last_event_id")
        unsent = client.get("/v1/events", headers={**tenant.headers, "Last-Event-ID": "9" * 18})
        assert (unsent.status_code, unsent.json()["error"]["code"]) == (400, "invalid_last_event_id")
        anonymous = client.get("/v1/events")
        assert anonymous.status_code == 401
        query = client.get("/v1/events", params={"x": "1"}, headers=tenant.headers)
        assert query.status_code == 400


def test_heartbeats_keep_a_quiet_stream_open(stream_edge: ServiceProcess, tenant: TenantHandle) -> None:
    with sse(url(stream_edge), "/v1/events", tenant.api_key) as stream:
        stream.next()
        with pytest.raises(TimeoutError):
            stream.next(timeout=1.6)
        assert stream.comments >= 2


def test_a_stopping_edge_ends_its_streams_at_once_and_says_why(spawn: SpawnFn, tenant: TenantHandle) -> None:
    edge = start_edge(spawn, workers=2, FATURA_EVENT_HEARTBEAT_SECONDS="0.5")
    with sse(url(edge), "/v1/events", tenant.api_key) as stream:
        stream.next()
        stopping = time.monotonic()
        edge.terminate()
        end = stream.next(timeout=5)
        with pytest.raises(EOFError):
            stream.next(timeout=5)
    assert end.event == "end" and end.data["reason"] == "shutdown"
    edge.wait_exit(timeout=10)
    # Without ending its streams the edge would wait out uvicorn's graceful shutdown (10 s)
    assert time.monotonic() - stopping < 5


def test_one_reader_per_edge_worker_serves_every_stream(
    stream_edge: ServiceProcess, pool: SyncPool, tenant: TenantHandle
) -> None:
    def feed_sessions() -> int:
        with pool.connection() as conn:
            row = conn.execute(
                """SELECT count(*) AS n FROM pg_stat_activity
                   WHERE datname = current_database() AND application_name = 'fatura-http-feed'"""
            ).fetchone()
        return int(row["n"]) if row else 0

    # Edges of earlier test modules may still read this database: count what this one adds.
    before = feed_sessions()
    with ExitStack() as streams:
        opened = [
            streams.enter_context(sse(url(stream_edge), "/v1/events", tenant.api_key)) for _ in range(6)
        ]
        for stream in opened:
            stream.next()
        job = new_job(pool, tenant.id)
        change_state(pool, tenant.id, job, "RUNNING")
        for stream in opened:
            assert [e.data["state"] for e in stream.take(2)] == ["READY", "RUNNING"]
        # Six streams on two workers: at most one reading session per worker, never one per stream
        assert feed_sessions() - before <= 2
