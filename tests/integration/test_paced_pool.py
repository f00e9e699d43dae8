"""A paced pool with no burst: the limiter lets one request through every 60/RPM seconds and turns
the rest away until then. The worker wakes itself when the pool reopens, so jobs it deferred run
then, without waiting for the scheduler's top-up (here there is no scheduler at all). Runs the
edge, relay, limiter, simulated provider and one inference worker as real processes."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fix_pipeline import Pipeline, StartPipeline, sample_text

PACED_POOL = """
[pools.paced]
rpm = 240
tpm = 1000000000
max_in_flight = 64
pacing = "gcra"
burst_seconds = 0

[tenant_defaults]
max_in_flight = 64
"""


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(
        PACED_POOL, FATURA_INFERENCE_LIMITER_POOL="paced", FATURA_PROVIDER_POOL="paced"
    )
    pipeline.start_worker()
    yield pipeline


def _claims(worker_url: str) -> dict[str, float]:
    text = httpx.get(f"{worker_url}/metrics", timeout=10).text
    return {
        sample.labels["result"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "fatura_inference_claims"
        for sample in family.samples
        if sample.name == "fatura_inference_claims_total"
    }


def test_jobs_a_paced_pool_turned_away_run_when_it_reopens_without_the_scheduler(pipe: Pipeline) -> None:
    # Given a pool paced at one request every 0.25 s with no burst, and no scheduler running
    tenant = pipe.make_tenant()
    text = sample_text("01_tr_kirtasiye_try.txt")
    # When eight jobs arrive at once, more than the pace lets start together (sent side by side: one
    # after another, a loaded machine could space them wider than the pace)
    with ThreadPoolExecutor(8) as submitters:
        job_ids = list(submitters.map(lambda _: pipe.submit(tenant, text), range(8)))
    # Then every one of them ends with its extraction
    for job_id in job_ids:
        assert pipe.wait_state(job_id, {"SUCCEEDED", "REVIEW_REQUIRED"}, timeout=60)["state"] == "SUCCEEDED"
    # And the pool did turn claims away, and the worker woke itself when it reopened
    assert pipe.workers[0].base_url is not None
    claims = _claims(pipe.workers[0].base_url)
    assert claims.get("deferred", 0) >= 1, claims
    assert claims.get("rewoken", 0) >= 1, claims
