"""``Watch`` from the real jobs-grpc process over the real PostgreSQL: the edge's event feed behind a
gRPC server stream, resumable from a cursor, ended when its key is revoked or the server stops.

The process trusts a looked-up key for a minute (``FATURA_AUTH_CACHE_SECONDS``), so a stream that
ends after its key is revoked ends because the stream's key is looked up again, not by chance.
"""

from __future__ import annotations

import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import httpx
import pytest
from fix_jobs_grpc import JobsGrpc, details, key_of, start_jobs_grpc
from prometheus_client.parser import text_string_to_metric_families

from fix_db import MakeTenant, SyncPool, TenantHandle
from fix_events import change_state, new_job
from fix_processes import SpawnFn
from services.acceptance.keys import create_key, revoke_key
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

FAST = {
    "FATURA_AUTH_CACHE_SECONDS": "60",
    "FATURA_EVENT_POLL_SECONDS": "0.05",
    "FATURA_EVENT_HEARTBEAT_SECONDS": "0.5",
    "FATURA_EVENT_AUTH_RECHECK_SECONDS": "0.5",
}


@pytest.fixture(scope="module")
def watch_server(spawn: SpawnFn) -> JobsGrpc:
    return start_jobs_grpc(spawn, **FAST)


HEARTBEAT = "heartbeat"


class Stream:
    """A Watch call read on a thread, so a test can wait for the next event with a timeout."""

    def __init__(self, call: Any) -> None:
        self.call = call
        self.events: queue.Queue[pb.WatchEvent | grpc.RpcError | str | None] = queue.Queue()
        self.heartbeats = 0
        self.responses = 0
        self.error: grpc.RpcError | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for response in self.call:
                self.responses += 1
                for event in response.events:
                    self.events.put(event)
                if not response.events:
                    self.events.put(HEARTBEAT)
        except grpc.RpcError as error:
            self.events.put(error)
            return
        self.events.put(None)

    def next(self, timeout: float = 10.0) -> pb.WatchEvent:
        """The next event that is not a heartbeat; raises the RpcError that ended the stream."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"no event within {timeout}s") from None
            if isinstance(item, grpc.RpcError):
                self.error = item
                raise item
            if item is None:
                raise EOFError("the stream ended with OK")
            if item == HEARTBEAT:
                self.heartbeats += 1
                continue
            assert isinstance(item, pb.WatchEvent)
            return item

    def take(self, count: int, timeout: float = 10.0) -> list[pb.WatchEvent]:
        deadline = time.monotonic() + timeout
        return [self.next(max(0.1, deadline - time.monotonic())) for _ in range(count)]

    def until(self, predicate: Callable[[pb.WatchEvent], bool], timeout: float = 10.0) -> list[pb.WatchEvent]:
        deadline = time.monotonic() + timeout
        seen = [self.next(max(0.1, deadline - time.monotonic()))]
        while not predicate(seen[-1]):
            seen.append(self.next(max(0.1, deadline - time.monotonic())))
        return seen


@contextmanager
def watch(server: JobsGrpc, api_key: str, **request: Any) -> Iterator[Stream]:
    with grpc.insecure_channel(server.address) as channel:
        call = pb_grpc.JobServiceStub(channel).Watch(
            pb.WatchRequest(**request), metadata=(("authorization", f"Bearer {api_key}"),)
        )
        stream = Stream(call)
        try:
            yield stream
        finally:
            call.cancel()


def tenant_seqs(pool: SyncPool, tenant_id: uuid.UUID, after: int = 0) -> list[int]:
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT seq FROM job_events WHERE tenant_id = %s AND seq > %s ORDER BY seq", (tenant_id, after)
        ).fetchall()
    return [int(r["seq"]) for r in rows]


def is_event_of(job_id: uuid.UUID, state: int) -> Callable[[pb.WatchEvent], bool]:
    return lambda e: e.job_event.job_id == str(job_id) and e.job_event.state == state


def open_streams(server: JobsGrpc) -> float:
    text = httpx.get(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        if family.name == "fatura_event_streams_open":
            return sum(sample.value for sample in family.samples)
    return 0.0


def test_a_jobs_events_arrive_in_order_after_a_snapshot(
    watch_server: JobsGrpc, pool: SyncPool, tenant: TenantHandle
) -> None:
    job = new_job(pool, tenant.id)
    with watch(watch_server, tenant.api_key, job_id=str(job)) as stream:
        snapshot = stream.next().snapshot
        assert snapshot.reason == "no_cursor" and "later events follow" in snapshot.message
        assert [(j.job_id, j.state, j.state_version) for j in snapshot.jobs] == [
            (str(job), pb.JOB_STATE_READY, 1)
        ]
        change_state(pool, tenant.id, job, "RUNNING")
        change_state(pool, tenant.id, job, "SUCCEEDED")
        events = [e.job_event for e in stream.take(2)]

    assert [(e.state, e.state_version, e.done) for e in events] == [
        (pb.JOB_STATE_RUNNING, 2, False),
        (pb.JOB_STATE_SUCCEEDED, 3, True),
    ]
    assert [e.seq for e in events] == tenant_seqs(pool, tenant.id)[1:]
    assert events[1].status_url == f"/v1/extraction-jobs/{job}" and events[1].kind == "state"
    assert events[1].at.seconds > 0


def test_resuming_from_a_cursor_replays_exactly_what_was_missed(
    watch_server: JobsGrpc, pool: SyncPool, tenant: TenantHandle
) -> None:
    first = new_job(pool, tenant.id)
    with watch(watch_server, tenant.api_key) as stream:
        assert stream.next().WhichOneof("event") == "snapshot"
        change_state(pool, tenant.id, first, "RUNNING")
        seen = stream.until(is_event_of(first, pb.JOB_STATE_RUNNING))[-1].job_event.seq
    # While the client is away, its jobs move on
    second = new_job(pool, tenant.id)
    change_state(pool, tenant.id, first, "SUCCEEDED")
    change_state(pool, tenant.id, second, "RUNNING")
    missed = tenant_seqs(pool, tenant.id, after=seen)
    assert len(missed) == 3

    with watch(watch_server, tenant.api_key, after_seq=seen) as stream:
        replayed = [e.job_event for e in stream.take(3)]
        change_state(pool, tenant.id, second, "SUCCEEDED")
        live = stream.next().job_event

    assert [e.seq for e in replayed] == missed  # no snapshot: nothing was pruned
    assert [(e.job_id, e.state) for e in replayed] == [
        (str(second), pb.JOB_STATE_READY),
        (str(first), pb.JOB_STATE_SUCCEEDED),
        (str(second), pb.JOB_STATE_RUNNING),
    ]
    assert (live.job_id, live.state) == (str(second), pb.JOB_STATE_SUCCEEDED)


def test_the_tenant_stream_shows_only_its_own_jobs_and_another_tenants_job_is_not_found(
    watch_server: JobsGrpc, pool: SyncPool, make_tenant: MakeTenant
) -> None:
    mine, theirs = make_tenant(), make_tenant()
    their_job = new_job(pool, theirs.id)
    for request in ({"job_id": str(their_job)}, {"job_id": str(uuid.uuid4())}, {"job_id": "nope"}):
        with watch(watch_server, mine.api_key, **request) as stream, pytest.raises(grpc.RpcError):
            stream.next()
        assert stream.error is not None and stream.error.code() == grpc.StatusCode.NOT_FOUND
        assert details(stream.error)["ErrorInfo"].reason == "JOB_NOT_FOUND"

    with watch(watch_server, mine.api_key) as stream:
        assert list(stream.next().snapshot.jobs) == []
        change_state(pool, theirs.id, their_job, "RUNNING")
        my_job = new_job(pool, mine.id)
        change_state(pool, mine.id, my_job, "RUNNING")
        events = stream.until(is_event_of(my_job, pb.JOB_STATE_RUNNING))
    assert {e.job_event.job_id for e in events} == {str(my_job)}


def test_a_bad_cursor_or_no_key_is_a_typed_error(watch_server: JobsGrpc, tenant: TenantHandle) -> None:
    with watch(watch_server, tenant.api_key, after_seq=-1) as stream, pytest.raises(grpc.RpcError):
        stream.next()
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details(stream.error)["BadRequest"].field_violations] == ["after_seq"]

    with grpc.insecure_channel(watch_server.address) as channel:
        call = pb_grpc.JobServiceStub(channel).Watch(pb.WatchRequest())
        with pytest.raises(grpc.RpcError) as refused:
            next(call)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_revoked_keys_stream_ends_within_seconds_and_says_why(
    watch_server: JobsGrpc, pool: SyncPool, tenant: TenantHandle
) -> None:
    info, key = create_key(pool, scope="tenant", tenant_id=tenant.id, label="watch")
    with watch(watch_server, key) as stream:
        assert stream.next().WhichOneof("event") == "snapshot"
        revoked_at = time.monotonic()
        revoke_key(pool, info.prefix)
        end = stream.next(timeout=5).end
        ended_after = time.monotonic() - revoked_at
        with pytest.raises(grpc.RpcError):
            stream.next(timeout=5)

    assert end.reason == "key_revoked" and "revoked" in end.message
    assert ended_after < 3.0
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.UNAUTHENTICATED
    assert details(stream.error)["ErrorInfo"].reason == "KEY_REVOKED"


def test_heartbeats_keep_a_quiet_stream_open_and_a_client_that_leaves_releases_it(
    watch_server: JobsGrpc, tenant: TenantHandle
) -> None:
    before = open_streams(watch_server)
    with watch(watch_server, tenant.api_key) as a, watch(watch_server, tenant.api_key) as b:
        a.next(), b.next()
        assert open_streams(watch_server) == before + 2
        with pytest.raises(TimeoutError):
            a.next(timeout=1.6)
        assert a.heartbeats >= 2
    deadline = time.monotonic() + 5
    while open_streams(watch_server) != before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert open_streams(watch_server) == before


def test_a_server_that_stops_ends_its_streams_so_clients_resume(spawn: SpawnFn, tenant: TenantHandle) -> None:
    server = start_jobs_grpc(spawn, **FAST)
    with watch(server, tenant.api_key) as stream:
        snapshot = stream.next().snapshot
        server.process.stop()
        end = stream.next(timeout=10).end
        with pytest.raises(grpc.RpcError):
            stream.next(timeout=10)

    assert end.reason == "shutdown"
    assert stream.error is not None and stream.error.code() == grpc.StatusCode.UNAVAILABLE
    assert details(stream.error)["RetryInfo"].retry_delay.seconds == 1
    assert snapshot.seq >= 0


def test_a_watch_sees_a_job_submitted_through_the_service(
    watch_server: JobsGrpc, make_tenant: MakeTenant
) -> None:
    """Given a tenant watching its jobs, when it submits one over gRPC, the stream shows it READY."""
    tenant = make_tenant()
    with (
        grpc.insecure_channel(watch_server.address) as channel,
        watch(watch_server, tenant.api_key) as stream,
    ):
        assert stream.next().WhichOneof("event") == "snapshot"
        accepted = pb_grpc.JobServiceStub(channel).Submit(
            pb.SubmitRequest(
                idempotency_key=f"w-{uuid.uuid4()}", document=pb.InlineDocument(text="FATURA 1")
            ),
            metadata=key_of(tenant),
        )
        event = stream.next().job_event
    assert (event.job_id, event.state, event.state_version) == (accepted.job_id, pb.JOB_STATE_READY, 1)
