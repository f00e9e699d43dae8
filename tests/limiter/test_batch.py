"""The Batch RPC: Acquire and Release calls in one round trip, each answered as its own RPC would be,
and the client's threads sharing Batches without sharing answers."""

from __future__ import annotations

import signal
import threading
import time
from typing import TYPE_CHECKING

import grpc
import pytest

from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.limiter.model import Denial, DenyReason, Grant, Outcome
from tests.limiter.conftest import SHARED_CONFIG

if TYPE_CHECKING:
    from tests.limiter.conftest import LimiterProcess, StartLimiter

UNKNOWN_PERMIT = "atomic/acme/00000000000000000000000000000000"


def acquire(key: str, pool: str = "atomic") -> pb.BatchItem:
    return pb.BatchItem(
        acquire=pb.AcquireRequest(
            pool=pool, tenant="acme", estimated_input_tokens=10, max_output_tokens=10, request_key=key
        )
    )


def release(permit_id: str) -> pb.BatchItem:
    return pb.BatchItem(release=pb.ReleaseRequest(permit_id=permit_id, outcome=pb.OUTCOME_NOT_SENT))


def test_each_item_is_answered_as_its_own_rpc_would_be(shared_limiter: LimiterProcess) -> None:
    """Given one Batch with a retried Acquire, a second Acquire on a pool of one slot, an unknown
    pool and a release of a permit that never existed
    Then the retry gets the same permit, one Acquire of the pool is denied IN_FLIGHT, and the two
    bad items fail with the codes their own RPCs get, without failing the others."""
    with shared_limiter.channel() as channel:
        stub = pb_grpc.LimiterServiceStub(channel)
        items = [
            acquire("k1"),
            acquire("k1"),
            acquire("k2"),
            acquire("k3", pool="nope"),
            release(UNKNOWN_PERMIT),
        ]
        results = stub.Batch(pb.BatchRequest(items=items), timeout=5).results
        assert [r.WhichOneof("result") for r in results] == ["acquire"] * 3 + ["error"] * 2
        answers = [r.acquire for r in results[:3]]
        granted = {a.granted.permit_id for a in answers if a.WhichOneof("result") == "granted"}
        denied = [a.denied for a in answers if a.WhichOneof("result") == "denied"]
        assert len(granted) == 1  # k1 twice is one permit; the pool has one slot
        assert all(d.reason == pb.DENY_REASON_IN_FLIGHT for d in denied) and len(denied) in (1, 2)
        assert results[3].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        assert "nope" in results[3].error.message
        assert results[4].error.code == grpc.StatusCode.NOT_FOUND.value[0]
        (permit_id,) = granted
        settled = stub.Batch(pb.BatchRequest(items=[release(permit_id)]), timeout=5).results
        assert settled[0].release.already_released is False
        again = stub.Release(pb.ReleaseRequest(permit_id=permit_id, outcome=pb.OUTCOME_COMPLETED), timeout=5)
        assert again.already_released is True  # the Batch's release was the first: it won
    with shared_limiter.client() as client:
        assert client.pool_status("atomic").in_flight.used == 0


def test_a_batch_over_the_limit_is_refused_whole_and_changes_nothing(shared_limiter: LimiterProcess) -> None:
    with shared_limiter.channel() as channel:
        stub = pb_grpc.LimiterServiceStub(channel)
        items = [acquire(f"many-{i}", pool="basic") for i in range(257)]
        with pytest.raises(grpc.RpcError) as refused:
            stub.Batch(pb.BatchRequest(items=items), timeout=5)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with shared_limiter.client() as client:
        assert client.pool_status("basic").in_flight.used == 0


def test_threads_sharing_batches_get_their_own_answers_and_the_cap_holds(
    shared_limiter: LimiterProcess,
) -> None:
    """Given 40 threads of one client acquiring at once on a pool of 30 slots (their calls share
    Batch RPCs)
    Then exactly 30 are granted, each a distinct permit, and 10 denied IN_FLIGHT; a retry of each
    key returns that thread's own answer, and every release settles its own permit."""
    results: dict[int, Grant | Denial] = {}
    with shared_limiter.client() as client:
        start = threading.Barrier(40)

        def take(i: int) -> None:
            start.wait()
            results[i] = client.acquire("race", "acme", 10, 10, lease_ms=30_000, request_key=f"thread-{i}")

        threads = [threading.Thread(target=take, args=(i,)) for i in range(40)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        grants = {i: r for i, r in results.items() if isinstance(r, Grant)}
        denials = [r for r in results.values() if isinstance(r, Denial)]
        assert len(grants) == 30 and len({g.permit_id for g in grants.values()}) == 30
        assert len(denials) == 10 and all(d.reason is DenyReason.IN_FLIGHT for d in denials)
        for i, grant in grants.items():
            assert client.acquire("race", "acme", 10, 10, lease_ms=30_000, request_key=f"thread-{i}") == grant
        settled: list[bool] = []

        def give_back(grant: Grant) -> None:
            settled.append(client.release(grant.permit_id, Outcome.NOT_SENT))

        threads = [threading.Thread(target=give_back, args=(g,)) for g in grants.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert settled == [True] * 30
        assert client.pool_status("race").in_flight.used == 0


def test_a_release_not_waited_for_leaves_before_the_acquire_that_follows_it(
    shared_limiter: LimiterProcess,
) -> None:
    """Given a pool of one slot whose permit a caller holds
    When it releases with release_later (no wait) and at once asks again, many times over
    Then every Acquire is granted: the Release travels first, with the Acquire or before it."""
    with shared_limiter.client() as client:
        for i in range(20):
            grant = client.acquire("later", "acme", 10, 10, lease_ms=30_000, request_key=f"later-{i}")
            assert isinstance(grant, Grant), (i, grant)
            client.release_later(grant.permit_id, Outcome.COMPLETED, 8, 2)
        # The last one travels alone after its hold, without any call to carry it.
        deadline = time.monotonic() + 10
        while client.pool_status("later").in_flight.used and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.pool_status("later").in_flight.used == 0


def test_closing_the_client_sends_the_releases_it_still_holds(shared_limiter: LimiterProcess) -> None:
    """Given releases made with release_later by several threads
    When the client is closed at once
    Then the limiter has every one of them when close() returns."""
    with shared_limiter.client() as client:
        grants = [
            client.acquire("race", "acme", 10, 10, lease_ms=30_000, request_key=f"closing-{i}")
            for i in range(6)
        ]
        assert all(isinstance(g, Grant) for g in grants)
        assert client.pool_status("race").in_flight.used == 6
    closing = shared_limiter.client()
    threads = [
        threading.Thread(target=closing.release_later, args=(g.permit_id, Outcome.NOT_SENT))
        for g in grants
        if isinstance(g, Grant)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    closing.close()
    with shared_limiter.client() as client:
        assert client.pool_status("race").in_flight.used == 0


def test_closing_the_client_waits_for_held_releases_already_on_the_wire(
    start_limiter: StartLimiter,
) -> None:
    """Given a release made with release_later that has left in a Batch the limiter has not answered
    (the limiter process is stopped)
    When the client is closed, and the limiter resumes a moment later
    Then close() waited for that answer: the permit is released, not cancelled with the channel."""
    limiter = start_limiter(SHARED_CONFIG)
    with limiter.client() as client:
        grant = client.acquire("race", "acme", 10, 10, lease_ms=60_000, request_key="on-the-wire")
        assert isinstance(grant, Grant)
    closing = limiter.client(settle_deadline_ms=5_000)
    assert closing.pool_status("race").in_flight.used == 1  # its channel is connected
    limiter.signal(signal.SIGSTOP)
    try:
        closing.release_later(grant.permit_id, Outcome.NOT_SENT)
        time.sleep(0.3)  # past the hold: the Release left alone, and waits for its answer
        closed = threading.Thread(target=closing.close)
        closed.start()
        time.sleep(0.3)
        assert closed.is_alive(), "close() returned with a Release still on the wire"
    finally:
        limiter.signal(signal.SIGCONT)
    closed.join(timeout=10)
    assert not closed.is_alive()
    with limiter.client() as client:
        assert client.pool_status("race").in_flight.used == 0


def test_an_acquire_carrying_a_held_release_waits_no_longer_than_its_own_deadline(
    start_limiter: StartLimiter,
) -> None:
    """Given a held Release (settle deadline 5 s) that will travel with the next Acquire (250 ms),
    and a limiter that stops answering
    When the Acquire is made
    Then it gives up at its own deadline (denied, fail closed), not at its passenger's; and the
    Release, cut off with it, travels again and is applied once the limiter answers."""
    limiter = start_limiter(SHARED_CONFIG)
    client = limiter.client(deadline_ms=250, settle_deadline_ms=5_000)
    try:
        grant = client.acquire("race", "acme", 10, 10, lease_ms=60_000, request_key="passenger")
        assert isinstance(grant, Grant)
        limiter.signal(signal.SIGSTOP)
        try:
            client.release_later(grant.permit_id, Outcome.NOT_SENT)
            started = time.monotonic()
            decision = client.acquire("race", "acme", 10, 10, lease_ms=60_000, request_key="driver")
            waited = time.monotonic() - started
        finally:
            limiter.signal(signal.SIGCONT)
        assert isinstance(decision, Denial) and decision.reason is DenyReason.UNAVAILABLE, decision
        assert waited < 1.0, f"the Acquire waited {waited:.2f} s for its passenger's deadline"
        deadline = time.monotonic() + 10
        with limiter.client() as observer:
            while observer.pool_status("race").in_flight.used and time.monotonic() < deadline:
                time.sleep(0.05)
            assert observer.pool_status("race").in_flight.used == 0
    finally:
        client.close()


def test_a_release_that_fails_later_is_logged_not_raised(
    shared_limiter: LimiterProcess, caplog: pytest.LogCaptureFixture
) -> None:
    with shared_limiter.client() as client:
        client.release_later(UNKNOWN_PERMIT, Outcome.COMPLETED, 1, 1)
        deadline = time.monotonic() + 10
        while "could not release permit" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.01)
    assert f"could not release permit {UNKNOWN_PERMIT}" in caplog.text
