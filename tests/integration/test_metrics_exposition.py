"""Every process's /metrics passes `promtool check metrics` after real traffic, carries only bounded
labels, and shows the completion SLI and the review rate where the transitions were written."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from fix_promtool import promtool_or_skip
from prometheus_client.parser import text_string_to_metric_families

from fix_pipeline import TERMINAL, Pipeline, StartPipeline, sample_text
from services.common.procs import free_port

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def scraped(pipeline_factory: StartPipeline) -> Iterator[dict[str, str]]:
    """One /metrics page per process kind, read after jobs went through the whole pipeline."""
    pipe: Pipeline = pipeline_factory()
    tenant = pipe.make_tenant()
    # A job cancelled before any worker runs: the edge writes that final state
    cancelled = pipe.submit(tenant, sample_text("02_de_buerotechnik_eur.txt"))
    with pipe.client() as client:
        answer = client.post(f"/v1/extraction-jobs/{cancelled}:cancel", headers=tenant.headers)
    assert answer.status_code == 200, answer.text
    worker = pipe.start_worker()
    scheduler = pipe.start_scheduler()
    ports = {"delivery-worker": free_port(), "delivery-scheduler": free_port(), "jobs-grpc": free_port()}
    extra = [
        pipe.spawn(
            "delivery-worker", **pipe.env, FATURA_DELIVERY_WORKER_METRICS_PORT=str(ports["delivery-worker"])
        ),
        pipe.spawn(
            "delivery-scheduler",
            **pipe.env,
            FATURA_DELIVERY_SCHEDULER_METRICS_PORT=str(ports["delivery-scheduler"]),
        ),
        pipe.spawn(
            "jobs-grpc",
            **pipe.env,
            FATURA_JOBS_GRPC_PORT=str(free_port()),
            FATURA_JOBS_GRPC_METRICS_PORT=str(ports["jobs-grpc"]),
        ),
    ]
    pipe.others.extend(extra)
    for name, port in ports.items():
        next(p for p in extra if p.name == name).wait_ready(f"http://127.0.0.1:{port}/readyz")
    # Traffic: one job that succeeds and one that needs a reviewer
    ok = pipe.submit(tenant, sample_text("01_tr_kirtasiye_try.txt"), priority="interactive")
    review = pipe.submit(tenant, sample_text("06_review_bad_arithmetic_try.txt"))
    assert pipe.wait_state(ok, TERMINAL)["state"] == "SUCCEEDED"
    assert pipe.wait_state(review, TERMINAL)["state"] == "REVIEW_REQUIRED"
    urls = {
        "edge": f"http://127.0.0.1:{pipe.edge.env['FATURA_HTTP_METRICS_PORT']}/metrics",
        "relay": f"http://127.0.0.1:{pipe.relay.env['FATURA_RELAY_METRICS_PORT']}/metrics",
        "inference-worker": f"{worker.base_url}/metrics",
        "inference-scheduler": f"http://127.0.0.1:{scheduler.env['FATURA_SCHEDULER_METRICS_PORT']}/metrics",
        "limiter": f"http://127.0.0.1:{pipe.others[0].env['FATURA_LIMITER_METRICS_PORT']}/metrics",
        **{name: f"http://127.0.0.1:{port}/metrics" for name, port in ports.items()},
    }
    pages = {}
    for name, url in urls.items():
        response = httpx.get(url, timeout=10)
        assert response.status_code == 200, (name, response.text)
        pages[name] = response.text
    # The scheduler measures the backlog once a pass (every 0.2 s here): a page read right after the
    # jobs finished may still show the pass before. Read it again until a pass after them, or 10 s.
    deadline = time.monotonic() + 10
    eligible = "fatura_scheduler_eligible_jobs"
    while _value(pages["inference-scheduler"], eligible) and time.monotonic() < deadline:
        time.sleep(0.1)
        pages["inference-scheduler"] = httpx.get(urls["inference-scheduler"], timeout=10).text
    yield pages


PROCESS_KINDS = [
    "edge",
    "relay",
    "inference-worker",
    "inference-scheduler",
    "limiter",
    "delivery-worker",
    "delivery-scheduler",
    "jobs-grpc",
]


@pytest.mark.parametrize("kind", PROCESS_KINDS)
def test_promtool_accepts_every_process_metrics_page(scraped: dict[str, str], kind: str) -> None:
    promtool = promtool_or_skip()
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=scraped[kind], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, f"{kind}: {checked.stdout}{checked.stderr}"


@pytest.mark.parametrize("kind", PROCESS_KINDS)
def test_no_series_is_labelled_with_an_id(scraped: dict[str, str], kind: str) -> None:
    fatura = [line for line in scraped[kind].splitlines() if line.startswith("fatura_")]
    assert fatura, f"{kind} exports no fatura_ series"
    assert not [line for line in fatura if _UUID.search(line)]


def _value(page: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        sample.value
        for family in text_string_to_metric_families(page)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )


def test_the_worker_reports_the_completion_sli_and_the_review_rate_separately(
    scraped: dict[str, str],
) -> None:
    page = scraped["inference-worker"]
    count = "fatura_job_completion_seconds_count"
    # The job that succeeded counts for the SLI; the one sent to review is its own outcome
    assert _value(page, count, priority="interactive", outcome="succeeded") == 1
    assert _value(page, count, priority="batch", outcome="review_required") == 1
    assert _value(page, count) == 2
    # And the provider's reported tokens and time to first token are there
    assert _value(page, "fatura_provider_tokens_total", kind="output") > 0
    assert _value(page, "fatura_provider_time_to_first_token_seconds_count") == 2


def test_the_edge_reports_a_cancellation_as_an_outcome_of_the_sli(scraped: dict[str, str]) -> None:
    count = "fatura_job_completion_seconds_count"
    assert _value(scraped["edge"], count, outcome="cancelled", priority="batch") == 1


def test_the_scheduler_reports_the_backlog_of_each_priority(scraped: dict[str, str]) -> None:
    page = scraped["inference-scheduler"]
    families = {family.name: family for family in text_string_to_metric_families(page)}
    for name in ("fatura_scheduler_eligible_jobs", "fatura_scheduler_oldest_eligible_age_seconds"):
        by_priority = {s.labels["priority"]: s.value for s in families[name].samples}
        assert by_priority == {"interactive": 0.0, "batch": 0.0}, name
