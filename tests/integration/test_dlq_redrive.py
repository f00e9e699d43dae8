"""A dead letter redriven with `fatura dlq redrive` is published again by a running scheduler, taken in
by the consumer's inbox, and its job runs: real edge, relay, worker, scheduler and RabbitMQ."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fix_amqp import Delivered, QueueReader
from fix_ops import dead_letter_row, fatura
from fix_pipeline import TERMINAL, Pipeline, StartPipeline
from fix_processes import ROOT
from services.common import deadletters
from services.sandbox.samples import load_samples


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    yield pipeline_factory()  # no worker and no scheduler yet: the test starts them when it needs them


def _take_off_the_queue(queue: str, job_id: str, timeout: float = 30.0) -> Delivered:
    """Consume the relay's message for ``job_id`` before any worker sees it."""
    reader = QueueReader(queue)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for delivered in reader.drain():
                if delivered.event.get("job_id") == job_id:
                    return delivered
            time.sleep(0.1)
    finally:
        reader.close()
    raise AssertionError(f"the relay did not publish the requested event of {job_id} within {timeout}s")


def _inbox_row(pipe: Pipeline, event_id: str) -> dict[str, Any] | None:
    with pipe.pool.connection() as conn:
        return conn.execute("SELECT * FROM execution_inbox WHERE event_id = %s", (event_id,)).fetchone()


def test_a_dead_letter_redriven_with_the_cli_is_published_by_the_scheduler_and_its_job_runs(
    pipe: Pipeline,
) -> None:
    # Given a job whose requested event was refused: taken off its queue into dead_letters
    queue = f"{pipe.env['FATURA_QUEUE_PREFIX']}.inference.ingest"
    job_id = pipe.submit(pipe.make_tenant(), load_samples()[0].text)
    refused = _take_off_the_queue(queue, job_id)
    dead_letter_id = deadletters.record(
        pipe.pool,
        queue=queue,
        actor=refused.actor_name,
        message_id=refused.message_id,
        reason="unexpected_error",
        detail="refused in a test",
        message=refused.raw,
    )
    pipe.start_worker()
    time.sleep(1.0)
    assert _inbox_row(pipe, refused.event_id) is None
    assert pipe.job(job_id)["state"] == "READY"

    # When an operator redrives it (and waits) while no scheduler runs yet, then one starts
    redrive = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "dlq", "redrive", str(dead_letter_id), "--timeout", "90"],
        cwd=ROOT,
        env={**os.environ, **pipe.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(1.0)
        assert redrive.poll() is None, "the redrive did not wait for a scheduler"
        pipe.start_scheduler()
        output, errors = redrive.communicate(timeout=90)
    finally:
        if redrive.poll() is None:
            redrive.kill()
            redrive.wait()

    # Then the scheduler published it again, the inbox took it in, and the job ran
    assert redrive.returncode == 0, output + errors
    assert "requested the redrive of 1" in output and "all 1 published again" in output
    letter = dead_letter_row(pipe.pool, dead_letter_id)
    assert letter["redriven_at"] is not None and letter["redrive_count"] == 1
    deadline = time.monotonic() + 30
    while _inbox_row(pipe, refused.event_id) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _inbox_row(pipe, refused.event_id) is not None
    assert pipe.wait_state(job_id, TERMINAL)["state"] == "SUCCEEDED"

    # And redriving it again changes nothing
    again = fatura("dlq", "redrive", str(dead_letter_id), env=pipe.env)
    assert "was redriven already" in again.stdout and "nothing to redrive" in again.stdout
    assert dead_letter_row(pipe.pool, dead_letter_id)["redrive_count"] == 1
