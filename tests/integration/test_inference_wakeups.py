"""How a requested job wakes the inference workers: a free slot of the worker that took it in, with
no broker message; while every slot is busy, one run wake-up per interval, not one per job; and
none for a job no longer waiting. Real processes, RabbitMQ and PostgreSQL; the worker's own metrics
say which wake-ups it made, and every job still runs."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest

from fix_pipeline import TERMINAL, Pipeline, StartPipeline, wait_until
from fix_processes import ServiceProcess
from services.common.db import SyncPool
from services.sandbox.samples import load_samples


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    # No scheduler: its top-up would send wake-ups of its own; here only the ingest's are at work.
    yield pipeline_factory()


@pytest.fixture(autouse=True)
def clean(pipe: Pipeline) -> Iterator[None]:
    pipe.reset()
    yield
    pipe.reset()


def _counters(worker: ServiceProcess) -> dict[str, float]:
    """The worker's ingest wake-ups by how, and its claims by result."""
    text = httpx.get(f"{worker.base_url}/metrics", timeout=5).text
    found: dict[str, float] = {}
    pattern = r'^fatura_inference_(ingest_wakeups|claims)_total\{(?:how|result)="([a-z_]+)"\} (\S+)$'
    for family, label, value in re.findall(pattern, text, re.MULTILINE):
        found[f"{family}:{label}"] = float(value)
    return found


def _inboxed(pool: SyncPool, job_ids: list[str]) -> int:
    """How many of these jobs' requested events the ingest has taken in."""
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM execution_inbox"
            " WHERE job_id = ANY(%s::uuid[]) AND event_type = 'extraction.requested.v1'",
            (job_ids,),
        ).fetchone()
    return int(row["n"]) if row else 0


def test_a_job_taken_in_while_a_slot_is_free_starts_that_slot_without_a_broker_wake_up(
    pipe: Pipeline,
) -> None:
    # Given a worker whose slots are all free
    worker = pipe.start_worker()
    tenant = pipe.make_tenant()
    # When a job is accepted
    job_id = pipe.submit(tenant, load_samples()[0].text)
    # Then it runs, started by the worker that took its event in, and no run wake-up was sent
    assert pipe.wait_state(job_id, TERMINAL, timeout=60)["state"] == "SUCCEEDED"
    counters = _counters(worker)
    assert counters.get("ingest_wakeups:local") == 1
    assert counters.get("ingest_wakeups:sent", 0) == 0
    assert counters.get("claims:started") == 1


def test_a_burst_behind_busy_slots_sends_one_wake_up_and_every_job_still_runs(pipe: Pipeline) -> None:
    # Given a worker with one slot, busy with a call that hangs for a few seconds, and a coalescing
    # interval longer than this test
    worker = pipe.start_worker(FATURA_INFERENCE_CONCURRENCY="1", FATURA_WAKE_COALESCE_SECONDS="60")
    tenant = pipe.make_tenant()
    samples = load_samples()
    pipe.fault("hang_before_headers", delay_s=6, count=1)
    first = pipe.submit(tenant, samples[0].text)
    pipe.wait_state(first, {"RUNNING"}, timeout=30)
    # When five more jobs are accepted while it is busy
    burst = [pipe.submit(tenant, samples[0].text) for _ in range(5)]
    wait_until(lambda: _inboxed(pipe.pool, burst) == 5, 30, "the burst taken in")
    # Then one run wake-up went out for the burst, the others were coalesced into it
    counters = _counters(worker)
    assert counters.get("ingest_wakeups:sent") == 1
    assert counters.get("ingest_wakeups:coalesced") == 4
    # And every job runs: the busy slot claims the next due job as it completes each one
    for job_id in [first, *burst]:
        assert pipe.wait_state(job_id, TERMINAL, timeout=60)["state"] == "SUCCEEDED"


def test_a_job_cancelled_before_its_event_is_taken_in_gets_no_wake_up_and_no_claim(pipe: Pipeline) -> None:
    # Given a job accepted while no worker runs, then cancelled
    tenant = pipe.make_tenant()
    job_id = pipe.submit(tenant, load_samples()[1].text)
    wait_until(lambda: pipe.published(job_id), 30, "the relay published its requested event")
    with pipe.client() as client:
        response = client.post(f"/v1/extraction-jobs/{job_id}:cancel", headers=tenant.headers)
    assert response.status_code == 200
    # When a worker takes its requested event in
    worker = pipe.start_worker()
    wait_until(lambda: _inboxed(pipe.pool, [job_id]) == 1, 30, "the event taken in")
    # Then no slot was started for it: it waits for nothing
    counters = _counters(worker)
    assert counters.get("ingest_wakeups:already_claimed") == 1
    assert not any(key.startswith("claims:") and value for key, value in counters.items())
    assert pipe.job(job_id)["state"] == "CANCELLED"
