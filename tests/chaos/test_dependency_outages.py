"""PostgreSQL, RabbitMQ and Redis go away and come back during a burst: nothing is lost, nothing is
dead-lettered, no process exits, and readiness says not-ready meanwhile (DESIGN §5.12).

The consumers reach the dependencies through the project's own TCP fault proxy, which really resets
every open connection and refuses new ones for the window; the test's own checks go direct.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from fix_pipeline import LIMITER_CONFIG, TERMINAL, Pipeline, StartPipeline
from fix_processes import ServiceProcess
from services.chaos.proxy import FaultProxy, ProxyThread
from services.common.procs import free_port, status
from services.sandbox.samples import load_samples

pytestmark = pytest.mark.chaos

CUT_SECONDS = 6.0


def _via(url: str, port: int) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)
    host = f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=f"{netloc[0]}@{host}" if len(netloc) == 2 else host))


class Proxies:
    def __init__(self) -> None:
        self.thread = ProxyThread()
        self.pg = FaultProxy("postgresql", "127.0.0.1", 5432, thread=self.thread)
        self.amqp = FaultProxy("rabbitmq", "127.0.0.1", 5672, thread=self.thread)
        self.redis = FaultProxy("redis", "127.0.0.1", 6379, thread=self.thread)
        for proxy in (self.pg, self.amqp, self.redis):
            proxy.start()

    def close(self) -> None:
        for proxy in (self.pg, self.amqp, self.redis):
            proxy.close()
        self.thread.close()


@pytest.fixture(scope="module")
def proxies() -> Iterator[Proxies]:
    p = Proxies()
    yield p
    p.close()


@pytest.fixture(scope="module")
def pipe(
    pipeline_factory: StartPipeline, proxies: Proxies, tmp_path_factory: pytest.TempPathFactory
) -> Pipeline:
    pipeline = pipeline_factory()
    env = pipeline.env
    proxied = {
        "FATURA_DATABASE_URL": _via(env["FATURA_DATABASE_URL"], proxies.pg.port),
        "FATURA_AMQP_URL": _via("amqp://guest:guest@127.0.0.1:5672/%2F", proxies.amqp.port),
        "FATURA_REDIS_URL": f"redis://127.0.0.1:{proxies.redis.port}/0",
        "FATURA_RECONCILE_GRACE_SECONDS": "5",
        "FATURA_REDELIVERY_MAX_MS": "3000",
    }
    # A limiter of this module's own, whose Redis is behind the proxy
    config = tmp_path_factory.mktemp("limiter") / "limiter.toml"
    config.write_text(LIMITER_CONFIG)
    port, metrics = free_port(), free_port()
    limiter = pipeline.spawn(
        "limiter",
        **{**env, **proxied},
        FATURA_LIMITER_PORT=str(port),
        FATURA_LIMITER_METRICS_PORT=str(metrics),
        FATURA_LIMITER_CONFIG=str(config),
        FATURA_LIMITER_KEY_PREFIX=f"fatura:test:{env['FATURA_QUEUE_PREFIX']}:proxied",
    )
    limiter.wait_ready(f"http://127.0.0.1:{metrics}/readyz")
    pipeline.others.append(limiter)
    pipeline.env = {**env, **proxied, "FATURA_LIMITER_ADDRESS": f"127.0.0.1:{port}"}
    pipeline.restart_relay()
    pipeline.start_processing()
    return pipeline


def _ready(process: ServiceProcess, port_variable: str) -> int:
    return status(f"http://127.0.0.1:{process.env[port_variable]}/readyz", timeout=3)


def _burst(pipe: Pipeline, n: int) -> dict[str, str]:
    """``n`` sample invoices submitted by a new tenant: job id -> the state its sample ends in."""
    tenant = pipe.make_tenant()
    samples = [load_samples()[i % len(load_samples())] for i in range(n)]
    return {pipe.submit(tenant, sample.text): sample.expect for sample in samples}


def _dead_letters(pipe: Pipeline) -> int:
    with pipe.pool.connection() as conn:
        row = conn.execute("SELECT count(*) AS n FROM dead_letters").fetchone()
    return int(row["n"]) if row else 0


def _all_settled(pipe: Pipeline, jobs: dict[str, str], timeout: float = 120.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with pipe.pool.connection() as conn:
            rows = conn.execute(
                "SELECT id::text, state FROM extraction_jobs WHERE id = ANY(%s::uuid[])", (list(jobs),)
            ).fetchall()
        states = {r["id"]: r["state"] for r in rows}
        if len(states) == len(jobs) and all(s in TERMINAL for s in states.values()):
            return states
        time.sleep(0.25)
    raise AssertionError(f"jobs not settled after {timeout}s: {states}")


def _alive(pipe: Pipeline) -> None:
    for process in [*pipe.workers, *pipe.schedulers, pipe.relay, *pipe.others]:
        assert process.alive(), (
            f"{process.name} exited with {process.process.returncode}:\n{process.log()[-3000:]}"
        )


def test_a_postgresql_cut_during_a_burst_loses_nothing_and_dead_letters_nothing(
    pipe: Pipeline, proxies: Proxies
) -> None:
    worker, scheduler = pipe.workers[0], pipe.schedulers[0]
    before = _dead_letters(pipe)
    # Given a burst of jobs on its way through the relay and the workers
    jobs = _burst(pipe, 16)
    # When every connection to PostgreSQL is reset and new ones refused for a few seconds
    proxies.pg.cut(CUT_SECONDS)
    time.sleep(1.5)
    # Then the worker and the scheduler say they are not ready, and are still running
    assert _ready(worker, "FATURA_INFERENCE_METRICS_PORT") == 503
    assert _ready(scheduler, "FATURA_SCHEDULER_METRICS_PORT") == 503
    jobs |= _burst(pipe, 8)  # accepted by the edge meanwhile (it talks to PostgreSQL directly)
    time.sleep(CUT_SECONDS)
    # And once PostgreSQL is back, every job ends as its sample says, with nothing dead-lettered
    assert _all_settled(pipe, jobs) == jobs
    assert _dead_letters(pipe) == before
    assert _ready(worker, "FATURA_INFERENCE_METRICS_PORT") == 200
    _alive(pipe)


def test_a_rabbitmq_cut_during_a_burst_loses_nothing_and_every_publisher_reconnects(
    pipe: Pipeline, proxies: Proxies
) -> None:
    worker, scheduler = pipe.workers[0], pipe.schedulers[0]
    before = _dead_letters(pipe)
    jobs = _burst(pipe, 16)
    proxies.amqp.cut(CUT_SECONDS)
    time.sleep(2.5)  # the readiness probe remembers its answer for 2 s
    assert _ready(worker, "FATURA_INFERENCE_METRICS_PORT") == 503
    assert _ready(scheduler, "FATURA_SCHEDULER_METRICS_PORT") == 503
    jobs |= _burst(pipe, 8)  # their events wait in the outbox until the relay reconnects
    time.sleep(CUT_SECONDS)
    assert _all_settled(pipe, jobs) == jobs
    assert _dead_letters(pipe) == before
    # And the scheduler's publisher came back: a job that needs a scheduler wake-up still runs
    pipe.fault("server_error", count=1)
    (retried,) = _burst(pipe, 1)
    job = pipe.wait_state(retried, TERMINAL, timeout=60)
    assert (job["state"], job["attempt"]) == ("SUCCEEDED", 2)
    _alive(pipe)


def test_a_redis_cut_closes_the_limiter_and_work_resumes_when_it_returns(
    pipe: Pipeline, proxies: Proxies
) -> None:
    worker = pipe.workers[0]
    before = _dead_letters(pipe)
    proxies.redis.cut(CUT_SECONDS)
    time.sleep(2.5)
    # While Redis is away the limiter grants nothing (fail closed) and the worker says not ready
    assert _ready(worker, "FATURA_INFERENCE_METRICS_PORT") == 503
    jobs = _burst(pipe, 8)
    time.sleep(1.0)
    with pipe.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM job_attempts WHERE job_id = ANY(%s::uuid[])", (list(jobs),)
        ).fetchone()
    assert row is not None and row["n"] == 0, "a provider call was made without a permit"
    time.sleep(CUT_SECONDS)
    # Then, with Redis back, every job runs and ends as its sample says
    assert _all_settled(pipe, jobs) == jobs
    assert _dead_letters(pipe) == before
    assert _ready(worker, "FATURA_INFERENCE_METRICS_PORT") == 200
    _alive(pipe)
