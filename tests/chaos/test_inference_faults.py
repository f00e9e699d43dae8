"""Inference under faults, with processes really killed, frozen and raced: every accepted job ends
in a state someone can explain, none is lost, no stale worker overwrites a newer result, and the
attempt counter is never reset."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fix_pipeline import TERMINAL, Pipeline, StartPipeline
from fix_processes import ServiceProcess
from services.sandbox.samples import load_samples

pytestmark = pytest.mark.chaos


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory()
    pipeline.start_scheduler()
    yield pipeline


@pytest.fixture(autouse=True)
def clean(pipe: Pipeline) -> Iterator[None]:
    pipe.clear_faults()
    yield
    pipe.clear_faults()
    for worker in pipe.workers:
        if worker.alive():
            os.killpg(worker.process.pid, signal.SIGCONT)
            worker.stop()
    pipe.workers.clear()


def _text(index: int = 0) -> str:
    return load_samples()[index].text


def test_a_worker_killed_after_the_provider_answered_loses_nothing_and_keeps_the_attempt_count(
    pipe: Pipeline,
) -> None:
    # Given a worker that dies (SIGKILL) right after the provider answers, before the commit
    doomed = pipe.start_worker(FATURA_FAULTS="crash_after_provider_response")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, _text())
    doomed.wait_exit(timeout=30)
    assert doomed.process.returncode == -signal.SIGKILL
    # When its lease expires the reaper reschedules the job, and a healthy worker runs it again
    pipe.start_worker()
    job = pipe.wait_state(job_id, TERMINAL)
    # Then the job succeeded on its second attempt and the lost attempt is on record
    assert job["state"] == "SUCCEEDED"
    assert job["attempt"] == 2
    outcomes = [a["outcome"] for a in pipe.attempts(job_id)]
    assert outcomes == ["lease_expired", "ok"]


def test_a_worker_killed_after_the_inbox_commit_before_the_ack_runs_the_job_once(pipe: Pipeline) -> None:
    # Given a worker that dies after committing the inbox row and before acking the message
    doomed = pipe.start_worker(FATURA_FAULTS="crash_after_inbox_commit")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, _text(1))
    doomed.wait_exit(timeout=30)
    # When RabbitMQ redelivers the unacked message to a healthy worker
    pipe.start_worker()
    job = pipe.wait_state(job_id, TERMINAL)
    # Then the redelivery is a duplicate: one inbox row, and the job ran to one result. (The doomed
    # worker may also have taken a scheduler wake-up and claimed the job before dying; then that
    # attempt is on record as lease_expired and the counter says 2.)
    assert job["state"] == "SUCCEEDED"
    outcomes = [a["outcome"] for a in pipe.attempts(job_id)]
    assert outcomes in (["ok"], ["lease_expired", "ok"])
    assert job["attempt"] == len(outcomes)
    with pipe.pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert row is not None and row["n"] == 1


def test_a_relay_killed_between_the_confirm_and_published_at_publishes_again_and_the_job_runs_once(
    pipe: Pipeline,
) -> None:
    # Given a relay that dies (SIGKILL) after RabbitMQ confirmed the publish, before published_at
    pipe.start_worker()
    doomed = pipe.restart_relay(FATURA_FAULTS="crash_after_publish_confirm")
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, _text(2))
    doomed.wait_exit(timeout=30)
    calls = pipe.provider_requests()
    # When a healthy relay publishes the same event again
    pipe.restart_relay()
    job = pipe.wait_state(job_id, TERMINAL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with pipe.pool.connection() as conn:
            row = conn.execute(
                "SELECT bool_and(published_at IS NOT NULL) AS done FROM outbox_events WHERE job_id = %s",
                (job_id,),
            ).fetchone()
        if row is not None and row["done"]:
            break
        time.sleep(0.2)
    # Then the worker took the second copy as a duplicate: one inbox row, one provider call, one attempt
    assert job["state"] == "SUCCEEDED"
    assert [a["outcome"] for a in pipe.attempts(job_id)] == ["ok"]
    assert pipe.provider_requests() - calls <= 1
    with pipe.pool.connection() as conn:
        inbox = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox WHERE job_id = %s", (job_id,)
        ).fetchone()
    assert inbox is not None and inbox["n"] == 1


def _wait_running(pipe: Pipeline, job_id: str, timeout: float = 30.0) -> dict[str, object]:
    return pipe.wait_state(job_id, {"RUNNING"}, timeout)


def test_a_stale_worker_that_resumes_after_its_lease_expired_cannot_overwrite_the_newer_result(
    pipe: Pipeline,
) -> None:
    # Given worker A inside a provider call that hangs for a few seconds
    pipe.fault("hang_before_headers", delay_s=6, count=1)
    a = pipe.start_worker()
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, _text())
    first = _wait_running(pipe, job_id)
    # When A is frozen (SIGSTOP) so its heartbeat stops, its lease expires, and worker B runs the job
    os.killpg(a.process.pid, signal.SIGSTOP)
    pipe.start_worker()
    done = pipe.wait_state(job_id, TERMINAL)
    assert done["state"] == "SUCCEEDED"
    assert done["fence"] > first["fence"]
    # And A wakes up, gets its (late) answer and tries to complete
    os.killpg(a.process.pid, signal.SIGCONT)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and "stale" not in [x["outcome"] for x in pipe.attempts(job_id)]:
        time.sleep(0.2)
    # Then A's completion was refused: the job keeps B's result and version, A's call is logged stale
    after = pipe.job(job_id)
    assert after["state_version"] == done["state_version"]
    assert after["fence"] == done["fence"]
    assert after["result"] == done["result"]
    outcomes = [x["outcome"] for x in pipe.attempts(job_id)]
    assert "stale" in outcomes
    assert outcomes.count("ok") == 1


def test_a_429_storm_puts_every_worker_into_the_pool_cooldown_without_a_retry_storm(pipe: Pipeline) -> None:
    # Given a provider answering every call with 429 and Retry-After: 3, and two workers
    pipe.fault("rate_limit_storm", retry_after=3)
    pipe.start_worker()
    pipe.start_worker()
    tenant = pipe.make_tenant()
    before = pipe.provider_requests()
    jobs = [pipe.submit(tenant, _text(i % 5)) for i in range(12)]
    # When the storm lasts four seconds
    time.sleep(4)
    during = pipe.provider_requests() - before
    # Then the cooldown holds every worker back: calls stay near the first wave (8 slots), not a storm
    assert during <= 2 * 8 + 4, f"{during} provider calls during a 4 s storm"
    # And once the storm is over every job completes; none failed or was lost
    pipe.clear_faults()
    for job_id in jobs:
        assert pipe.wait_state(job_id, TERMINAL, timeout=90)["state"] == "SUCCEEDED"


def test_the_deadline_passing_ends_the_job_in_failed_terminal(pipe: Pipeline) -> None:
    # Given a job whose provider call hangs, and a deadline that passes meanwhile
    pipe.fault("hang_before_headers", delay_s=5, count=1)
    pipe.start_worker()
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, _text())
    _wait_running(pipe, job_id)
    with pipe.pool.connection() as conn:
        conn.execute(
            "UPDATE extraction_jobs SET deadline_at = now() + interval '1 second' WHERE id = %s", (job_id,)
        )
    # Then the scheduler fails it with deadline_exceeded, and the late answer does not revive it
    job = pipe.wait_state(job_id, TERMINAL)
    assert job["state"] == "FAILED_TERMINAL"
    assert job["error_class"] == "deadline_exceeded"
    time.sleep(5)
    assert pipe.job(job_id)["state"] == "FAILED_TERMINAL"
    with pipe.pool.connection() as conn:
        failed = conn.execute(
            "SELECT count(*) AS n FROM outbox_events WHERE job_id = %s AND event_type = %s",
            (job_id, "extraction.failed.v1"),
        ).fetchone()
    assert failed is not None and failed["n"] == 1


def test_cancel_stops_a_job_not_yet_started_and_discards_the_result_of_a_running_one(pipe: Pipeline) -> None:
    tenant = pipe.make_tenant()
    # A job cancelled before any worker exists never reaches the provider
    waiting = pipe.submit(tenant, _text())
    with pipe.client() as c:
        assert c.post(f"/v1/extraction-jobs/{waiting}:cancel", headers=tenant.headers).status_code == 200
    # A running job cancelled mid-call keeps CANCELLED when its answer arrives
    pipe.fault("hang_before_headers", delay_s=3, count=1)
    pipe.start_worker()
    running = pipe.submit(tenant, _text(1))
    _wait_running(pipe, running)
    with pipe.client() as c:
        assert c.post(f"/v1/extraction-jobs/{running}:cancel", headers=tenant.headers).status_code == 200
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not pipe.attempts(running):
        time.sleep(0.2)
    assert pipe.job(waiting)["state"] == "CANCELLED"
    assert pipe.job(waiting)["attempt"] == 0
    assert pipe.attempts(waiting) == []
    after = pipe.job(running)
    assert after["state"] == "CANCELLED"
    assert after["result"] is None
    assert [a["outcome"] for a in pipe.attempts(running)] == ["stale"]


def _leases_lost(worker: ServiceProcess) -> float:
    text = httpx.get(f"{worker.base_url}/metrics", timeout=5).text
    (family,) = (f for f in text_string_to_metric_families(text) if f.name == "fatura_inference_leases_lost")
    return sum(sample.value for sample in family.samples if sample.name.endswith("_total"))


def test_a_heartbeat_racing_its_slots_completions_reports_only_the_lease_really_taken(pipe: Pipeline) -> None:
    # Given a worker whose heartbeat renews its leases every 100 ms while its slots finish job after job
    worker = pipe.start_worker(FATURA_HEARTBEAT_SECONDS="0.1", FATURA_INFERENCE_CONCURRENCY="8")
    tenant = pipe.make_tenant()
    samples = load_samples()
    jobs = [pipe.submit(tenant, samples[i % len(samples)].text) for i in range(80)]
    # When every job ends
    for job_id in jobs:
        assert pipe.wait_state(job_id, TERMINAL)["attempt"] == 1
    # Then no renewal that met a slot's own completion was taken for a lost lease (no cut, no warning)
    assert _leases_lost(worker) == 0
    # And a job cancelled in the middle of its call still is: its lease is lost and its call cut
    pipe.fault("hang_before_headers", delay_s=5, count=1)
    running = pipe.submit(tenant, _text())
    _wait_running(pipe, running)
    with pipe.client() as c:
        assert c.post(f"/v1/extraction-jobs/{running}:cancel", headers=tenant.headers).status_code == 200
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _leases_lost(worker) == 0:
        time.sleep(0.05)
    assert _leases_lost(worker) == 1
    assert pipe.wait_state(running, TERMINAL)["state"] == "CANCELLED"
