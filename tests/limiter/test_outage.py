"""Redis or the limiter unreachable: the server answers UNAVAILABLE at once, the client fails closed
by default, uses its bounded emergency quota when configured, and both recover when Redis returns."""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from grpc_health.v1 import health_pb2
from prometheus_client import REGISTRY

from services.common.procs import free_port
from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.limiter.client import LimiterClient
from services.limiter.config import parse_config
from services.limiter.emergency import EmergencyQuota
from services.limiter.errors import LimiterUnavailable
from services.limiter.model import Denial, DenyReason, Grant, Outcome
from services.limiter.settings import LimiterSettings

if TYPE_CHECKING:
    from tests.limiter.conftest import PrivateRedis, StartLimiter

CONFIG = """
[pools.p]
pacing = "window"
rpm = 1000
tpm = 1000000
max_in_flight = 8
"""
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def emergency_count(pool: str, result: str) -> float:
    value = REGISTRY.get_sample_value(
        "fatura_limiter_client_emergency_total", {"pool": pool, "result": result}
    )
    return value or 0.0


@pytest.mark.chaos
def test_redis_down_fails_closed_then_emergency_quota_then_normal_service(
    start_limiter: StartLimiter, private_redis: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a limiter on a private Redis, a default client (emergency share 0) and a client
    allowed an emergency share of 0.25 (2 of the pool's 8 slots)
    When Redis is killed
    Then the server answers UNAVAILABLE (not a hang, not a grant); the default client is denied
    UNAVAILABLE; the other gets exactly 2 emergency permits, each with a metric and a log line,
    and releases them locally
    When Redis is started again
    Then the limiter reports SERVING and grants real permits again."""
    limiter = start_limiter(CONFIG, redis_url=private_redis.url)
    closed = limiter.client()
    emergency = EmergencyQuota.from_config(parse_config(CONFIG), 0.25)
    open_share = LimiterClient(limiter.address, deadline_ms=2_000, emergency=emergency)
    try:
        assert isinstance(closed.acquire("p", "acme", 10, 10), Grant)

        private_redis.kill()
        with grpc.insecure_channel(limiter.address) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                pb_grpc.LimiterServiceStub(channel).Acquire(
                    pb.AcquireRequest(pool="p", tenant="acme", estimated_input_tokens=1, request_key="k"),
                    timeout=5,
                )
        assert raised.value.code() is grpc.StatusCode.UNAVAILABLE, raised.value
        assert "redis unavailable" in raised.value.details()
        limiter.wait_health(NOT_SERVING)

        denied = closed.acquire("p", "acme", 10, 10)
        assert denied == Denial(DenyReason.UNAVAILABLE, 1_000)
        with pytest.raises(LimiterUnavailable):
            closed.report_throttle("p", 1_000)

        before = emergency_count("p", "granted")
        caplog.set_level(logging.WARNING, logger="services.limiter.client")
        caplog.clear()
        first = open_share.acquire("p", "acme", 10, 10)
        second = open_share.acquire("p", "acme", 10, 10)
        third = open_share.acquire("p", "acme", 10, 10)
        assert isinstance(first, Grant) and first.emergency
        assert isinstance(second, Grant) and second.emergency
        assert isinstance(third, Denial) and third.reason is DenyReason.UNAVAILABLE
        assert emergency_count("p", "granted") == before + 2
        assert sum("EMERGENCY permit" in r.getMessage() for r in caplog.records) == 2
        # Released locally: with Redis down a call to the limiter would raise LimiterUnavailable.
        assert open_share.release(first.permit_id, Outcome.COMPLETED, 5, 5) is True
        assert open_share.renew(second.permit_id) > 0

        private_redis.start()
        limiter.wait_health(SERVING)
        back = open_share.acquire("p", "acme", 10, 10)
        assert isinstance(back, Grant) and not back.emergency
        assert "loading them again" in limiter.log()  # the new Redis had no scripts: NOSCRIPT handled
        assert open_share.release(back.permit_id, Outcome.COMPLETED, 5, 5) is True
        assert closed.pool_status("p").in_flight.used == 0  # Redis came back empty: no persistence
    finally:
        closed.close()
        open_share.close()


def test_no_limiter_listening_means_denied_not_granted() -> None:
    """Given nothing listening at the limiter's address and the default emergency share (0)
    Then acquire is a Denial with reason UNAVAILABLE: the client never fails open."""
    with LimiterClient(f"127.0.0.1:{free_port()}", deadline_ms=200) as client:
        before = emergency_count("p", "closed")
        result = client.acquire("p", "acme", 10, 10)
        assert result == Denial(DenyReason.UNAVAILABLE, 1_000)
        assert emergency_count("p", "closed") == before + 1
        with pytest.raises(LimiterUnavailable):
            client.release("p/acme/" + "0" * 32, Outcome.COMPLETED)


def test_the_emergency_share_setting_gives_local_permits_sized_from_the_pool_file(tmp_path: Path) -> None:
    """Given FATURA_LIMITER_EMERGENCY_SHARE=0.25 and a pool of 8 slots in FATURA_LIMITER_CONFIG
    When the limiter cannot be reached
    Then this process gets 2 emergency permits, then a denial."""
    config = tmp_path / "limiter.toml"
    config.write_text(CONFIG)
    settings = LimiterSettings.from_env(
        {
            "FATURA_LIMITER_CONFIG": str(config),
            "FATURA_LIMITER_ADDRESS": f"127.0.0.1:{free_port()}",
            "FATURA_LIMITER_EMERGENCY_SHARE": "0.25",
            "FATURA_LIMITER_DEADLINE_MS": "200",
        }
    )
    with LimiterClient.from_settings(settings) as client:
        results = [client.acquire("p", "acme", 10, 10) for _ in range(3)]
    assert [isinstance(r, Grant) and r.emergency for r in results] == [True, True, False]


@pytest.mark.chaos
def test_an_acquire_that_timed_out_but_was_granted_is_given_back(
    start_limiter: StartLimiter, private_redis: PrivateRedis
) -> None:
    """Given a client with a 100 ms deadline
    When Redis stalls (SIGSTOP) under an Acquire, the client gives up, and Redis then resumes and
    grants the permit nobody is waiting for
    Then the client's next successful call releases that orphan (NOT_SENT): it does not hold a
    slot until its lease runs out."""
    limiter = start_limiter(CONFIG, redis_url=private_redis.url)
    with LimiterClient(limiter.address, deadline_ms=100) as client, limiter.client() as observer:
        assert private_redis.process is not None
        private_redis.process.send_signal(signal.SIGSTOP)
        try:
            assert client.acquire("p", "acme", 10, 10) == Denial(DenyReason.UNAVAILABLE, 1_000)
        finally:
            private_redis.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while observer.pool_status("p").in_flight.used != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert observer.pool_status("p").in_flight.used == 1  # the orphan: granted after the deadline
        fresh = client.acquire("p", "acme", 10, 10)
        assert isinstance(fresh, Grant)
        assert observer.pool_status("p").in_flight.used == 1  # only the fresh permit is held


@pytest.mark.chaos
def test_a_timed_out_acquire_does_not_give_back_a_permit_another_caller_retried_and_holds(
    start_limiter: StartLimiter, private_redis: PrivateRedis
) -> None:
    """Given a client whose Acquire (request_key K) timed out while Redis stalled, and was granted
    after its deadline
    When another worker retries the same job with the same K and is handed that permit
    Then the first client's clean-up leaves the permit alone: it stays held, counted in flight,
    until the worker that holds it releases it."""
    limiter = start_limiter(CONFIG, redis_url=private_redis.url)
    with (
        LimiterClient(limiter.address, deadline_ms=100) as first,
        LimiterClient(limiter.address) as second,
        limiter.client() as observer,
    ):
        assert private_redis.process is not None
        private_redis.process.send_signal(signal.SIGSTOP)
        try:
            assert first.acquire("p", "acme", 10, 10, request_key="job-7/fence-3") == Denial(
                DenyReason.UNAVAILABLE, 1_000
            )
        finally:
            private_redis.process.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 10
        while observer.pool_status("p").in_flight.used != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        retried = second.acquire("p", "acme", 10, 10, request_key="job-7/fence-3")
        assert isinstance(retried, Grant)

        other = first.acquire("p", "acme", 10, 10)  # its next call settles what it gave up on
        assert isinstance(other, Grant)
        assert observer.pool_status("p").in_flight.used == 2  # the retried permit is still held
        assert second.release(retried.permit_id, Outcome.COMPLETED, 5, 5)
        assert observer.pool_status("p").in_flight.used == 1


def test_a_first_connection_slower_than_a_tenth_of_a_second_still_gets_its_answer(
    start_limiter: StartLimiter,
) -> None:
    """Given a limiter that takes 0.3 s to answer a new connection (stopped, then resumed), as one
    far away over TLS or on a starved machine may
    When a new client asks for a permit with a 2 s deadline
    Then it is granted: the connection attempt was not given up after 0.1 s, which made every
    call UNAVAILABLE until some attempt happened to finish in time."""
    limiter = start_limiter(CONFIG)
    client = limiter.client(deadline_ms=2_000)
    try:
        limiter.signal(signal.SIGSTOP)
        resumed = threading.Timer(0.3, limiter.signal, (signal.SIGCONT,))
        resumed.start()
        try:
            decision = client.acquire("p", "acme", 1, 1, request_key="slow-first-connection")
        finally:
            resumed.join()
        assert isinstance(decision, Grant), decision
    finally:
        client.close()
