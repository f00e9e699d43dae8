"""Lost broker messages strand nothing: the database is the truth, and the schedulers find what a
lost message would leave behind and drive it again (DESIGN §5.12). Messages are really deleted
from RabbitMQ here (the queue is purged), the processes are real, and the scheduler's metrics say
what it re-drove."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import pika
import pytest

from fix_amqp import AMQP_URL
from fix_pipeline import TERMINAL, Pipeline, StartPipeline, wait_until
from services.common.broker import DELIVERY_LIMIT
from services.limiter.client import LimiterClient
from services.sandbox.samples import load_samples

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory()
    pipeline.start_scheduler(FATURA_RECONCILE_GRACE_SECONDS="1")
    yield pipeline


@pytest.fixture(autouse=True)
def clean(pipe: Pipeline) -> Iterator[None]:
    pipe.reset()
    yield
    pipe.reset()


def _purge(queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(AMQP_URL))
    try:
        frame = connection.channel().queue_purge(queue)
        return int(frame.method.message_count)
    finally:
        connection.close()


def _redriven(pipe: Pipeline, kind: str) -> float:
    scheduler = pipe.schedulers[0]
    port = scheduler.env["FATURA_SCHEDULER_METRICS_PORT"]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    match = re.search(rf'^fatura_reconciler_redriven_total\{{kind="{kind}"\}} (\S+)$', text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def _inboxed(pipe: Pipeline, job_id: str) -> int:
    with pipe.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox WHERE job_id = %s", (job_id,)
        ).fetchone()
    return int(row["n"]) if row else 0


def test_a_requested_event_deleted_from_the_queue_is_published_again_and_the_job_runs(pipe: Pipeline) -> None:
    # Given a job whose requested event the relay published, and no worker to take it in
    ingest = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    before = _redriven(pipe, "requested_event")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[0].text)
    wait_until(lambda: pipe.published(job_id), 30, "the relay published the event")
    # When the message is lost (deleted from the queue before any consumer saw it)
    assert _purge(ingest) >= 1
    pipe.start_worker()
    # Then the job runs once (the database says it is due, whatever the queue holds), and the
    # reconciler finds a published event no inbox recorded and publishes it again
    job = pipe.wait_state(job_id, TERMINAL, timeout=60)
    assert job["state"] == "SUCCEEDED"
    wait_until(lambda: _inboxed(pipe, job_id) == 1, 30, "the event taken in again")
    assert _redriven(pipe, "requested_event") >= before + 1
    assert [a["outcome"] for a in pipe.attempts(job_id)] == ["ok"]


def test_a_due_job_whose_wake_up_was_lost_is_woken_by_the_scheduler(pipe: Pipeline) -> None:
    # Given a job taken into the execution inbox whose run wake-up was lost
    prefix = pipe.env["FATURA_QUEUE_PREFIX"]
    before = _redriven(pipe, "job_wakeup")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[1].text)
    wait_until(lambda: pipe.published(job_id), 30, "the relay published the event")
    _purge(f"{prefix}.inference.ingest")
    with pipe.pool.connection() as conn:
        event = conn.execute(
            "SELECT event_id, payload FROM outbox_events WHERE job_id = %s", (job_id,)
        ).fetchone()
        assert event is not None
        conn.execute(
            "INSERT INTO execution_inbox (event_id, job_id, event_type, payload_digest)"
            " VALUES (%s, %s, 'extraction.requested.v1', 'taken in before its wake-up was lost')",
            (event["event_id"], job_id),
        )
    _purge(f"{prefix}.inference.run")
    # When a worker is there to run it
    pipe.start_worker()
    # Then the scheduler's top-up sends the missing wake-up and the job runs
    assert pipe.wait_state(job_id, TERMINAL, timeout=60)["state"] == "SUCCEEDED"
    assert _redriven(pipe, "job_wakeup") >= before + 1


def test_a_worker_that_loses_its_job_cuts_the_call_and_releases_its_permit(pipe: Pipeline) -> None:
    # Given a worker whose provider call hangs (for longer than this test runs)
    pipe.fault("hang_before_headers", delay_s=120, count=1)
    pipe.start_worker()
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[2].text)
    pipe.wait_state(job_id, {"RUNNING"}, timeout=30)
    limiter = LimiterClient(pipe.env["FATURA_LIMITER_ADDRESS"], deadline_ms=2000, settle_deadline_ms=2000)
    try:
        wait_until(lambda: limiter.pool_status("sandbox").in_flight.used == 1, 10, "the call holds a permit")
        # When the tenant cancels the job while the call is in flight
        with pipe.client() as c:
            assert c.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers).status_code == 200
        # Then within a heartbeat the worker cuts the call it no longer owns, and the permit is
        # released, long before the provider would have answered
        wait_until(lambda: limiter.pool_status("sandbox").in_flight.used == 0, 15, "the permit released")
    finally:
        limiter.close()
    wait_until(lambda: pipe.attempts(job_id), 10, "the cut call logged")
    (attempt,) = pipe.attempts(job_id)
    assert (attempt["outcome"], attempt["error_class"]) == ("stale", "cancelled")
    job = pipe.job(job_id)
    assert job["state"] == "CANCELLED"
    # And the call that was sent is not refunded: its whole reservation stays on the job's usage
    assert job["usage"]["total_tokens"] == job["estimated_tokens"]
    with pipe.pool.connection() as conn:
        charged = conn.execute(
            "SELECT coalesce(sum(tokens), 0) AS t FROM daily_token_usage WHERE tenant_id = %s",
            (tenant.id,),
        ).fetchone()
    assert charged is not None and charged["t"] == job["estimated_tokens"]


def test_a_message_that_keeps_killing_its_worker_ends_in_dead_letters_with_its_reason(pipe: Pipeline) -> None:
    # Given a requested event whose every delivery kills the worker that takes it (the worker dies
    # after committing the inbox row, before the ack, each time)
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[3].text)
    wait_until(lambda: pipe.published(job_id), 30, "the relay published the event")
    with pipe.pool.connection() as conn:
        event = conn.execute("SELECT event_id FROM outbox_events WHERE job_id = %s", (job_id,)).fetchone()
    assert event is not None
    message_id = str(event["event_id"])

    def dead_letter() -> dict[str, object] | None:
        with pipe.pool.connection() as conn:
            row: dict[str, object] | None = conn.execute(
                "SELECT * FROM dead_letters WHERE message_id = %s", (message_id,)
            ).fetchone()
        return row

    # When a worker is started again after each death (as a supervisor would)
    deaths = 0
    deadline = time.monotonic() + 120
    while dead_letter() is None and time.monotonic() < deadline:
        doomed = pipe.spawn(
            "inference-worker",
            **{**pipe.env, "FATURA_FAULTS": "crash_after_inbox_commit", "FATURA_INFERENCE_METRICS_PORT": "0"},
        )
        try:
            doomed.wait_exit(timeout=15)
            deaths += 1
        except subprocess.TimeoutExpired:
            doomed.kill()  # no delivery came: RabbitMQ has given up on the message
    # Then RabbitMQ gave up at the delivery limit, and the scheduler recorded it with its reason
    row = dead_letter()
    assert row is not None, f"no dead letter after {deaths} worker deaths"
    assert (row["source"], row["reason"]) == ("broker", "delivery_limit")
    assert DELIVERY_LIMIT <= deaths <= DELIVERY_LIMIT + 2
    assert row["message"]["kwargs"]["event"]["job_id"] == job_id  # type: ignore[index]
