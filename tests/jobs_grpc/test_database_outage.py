"""The JobService while PostgreSQL goes away and comes back (DESIGN §5.12): calls answer UNAVAILABLE
with a retry delay, health says NOT_SERVING and /readyz not ready, the process keeps running, and
everything works again once the database is back, an open Watch stream included.

The process reaches PostgreSQL through the project's TCP fault proxy, which resets every open
connection and refuses new ones for the window; the test's own checks go direct.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import grpc
import pytest
from fix_jobs_grpc import JobsGrpc, details, key_of, refusal, start_jobs_grpc, submit_request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fix_db import TenantHandle
from fix_processes import SpawnFn
from services.chaos.proxy import FaultProxy
from services.common.procs import status
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb
from services.common.protos.fatura.jobs.v1 import jobs_pb2_grpc as pb_grpc

pytestmark = pytest.mark.chaos

CUT_SECONDS = 6.0
POOL_WAIT_SECONDS = 1.0


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


@pytest.fixture
def proxy() -> Iterator[FaultProxy]:
    pg = FaultProxy("postgresql", "127.0.0.1", 5432)
    pg.start()
    yield pg
    pg.close()


def _refused_soon(call: Callable[[], object], tries: int = 3) -> grpc.RpcError:
    """The error of the first of a few calls half a second apart that fails. A connection the pool
    opened in the very instant of the cut has been seen to carry one more call (rarely)."""
    for _ in range(tries - 1):
        try:
            call()
        except grpc.RpcError as error:
            return error
        time.sleep(0.5)
    return refusal(call)


def _eventually(check: Callable[[], bool], what: str, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what} not within {timeout}s")
        time.sleep(0.1)
    return time.monotonic() - started


def test_calls_answer_unavailable_while_the_database_is_away_and_work_again_after(
    spawn: SpawnFn, database_url: str, proxy: FaultProxy, tenant: TenantHandle
) -> None:
    # A call during the cut fails either on a pooled connection the cut broke or, when the pool has
    # none left (the Watch stream's feed may have taken and lost the last one), after waiting this
    # long for a new one: well inside the cut, so it cannot outwait it and succeed after it.
    server: JobsGrpc = start_jobs_grpc(
        spawn,
        FATURA_DATABASE_URL=_via(database_url, proxy.port),
        FATURA_EVENT_POLL_SECONDS="0.05",
        FATURA_DB_POOL_TIMEOUT_SECONDS=str(POOL_WAIT_SECONDS),
    )
    ready_url = f"http://127.0.0.1:{server.metrics_port}/readyz"
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.JobServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)

        def serving() -> bool:
            answer = health.Check(
                health_pb2.HealthCheckRequest(service="fatura.jobs.v1.JobService"), timeout=5
            )
            return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)

        stream = stub.Watch(pb.WatchRequest(), metadata=key_of(tenant))
        events = (event for response in stream for event in response.events)
        assert next(events).WhichOneof("event") == "snapshot"
        stub.Submit(submit_request(f"before-{uuid.uuid4()}"), metadata=key_of(tenant), timeout=15)
        assert next(events).job_event.state == pb.JOB_STATE_READY

        proxy.cut(CUT_SECONDS)
        error = _refused_soon(
            lambda: stub.Submit(submit_request(f"during-{uuid.uuid4()}"), metadata=key_of(tenant), timeout=15)
        )
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        found = details(error)
        assert (
            found["ErrorInfo"].reason == "DATABASE_UNAVAILABLE"
            and found["RetryInfo"].retry_delay.seconds == 5
        )
        _eventually(lambda: not serving(), "NOT_SERVING", 4)
        assert status(ready_url) == 503

        _eventually(serving, "SERVING again", CUT_SECONDS + 10)
        assert status(ready_url) == 200
        after = stub.Submit(submit_request(f"after-{uuid.uuid4()}"), metadata=key_of(tenant), timeout=15)
        # The stream opened before the cut stays open and sees the job submitted after it
        event = next(events).job_event
        stream.cancel()
    assert (event.job_id, event.state) == (after.job_id, pb.JOB_STATE_READY)
    assert server.process.alive()
