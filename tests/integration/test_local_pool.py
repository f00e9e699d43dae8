"""A local vLLM pool in the real pipeline: the worker's permits hold prompt + max output of the
pool's KV cache, and a document no wait could admit fails at once with a typed error. Runs the
edge, relay, limiter (a ``kind = "local"`` pool) and the simulated provider in its ``vllm`` mode
(the same KV cache) as real processes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fix_ops import make_operator
from fix_pipeline import TERMINAL, Pipeline, StartPipeline, sample_text
from services.limiter import LimiterClient

KV_BLOCKS, BLOCK_SIZE = 500, 16  # 8,000 tokens of KV cache, in the limiter and in the server
MAX_OUTPUT = 1_000
LOCAL_POOL = f"""
[pools.gpu]
kind = "local"
rpm = 100000
tpm = 1000000000
max_in_flight = 64
kv_blocks = {KV_BLOCKS}
block_size = {BLOCK_SIZE}

[tenant_defaults]
max_in_flight = 64
"""
PADDING = "Terms and conditions: payment within thirty days; goods remain ours until paid in full. "


@pytest.fixture(scope="module")
def pipe(pipeline_factory: StartPipeline) -> Iterator[Pipeline]:
    pipeline = pipeline_factory(
        LOCAL_POOL,
        FATURA_INFERENCE_LIMITER_POOL="gpu",
        FATURA_PROVIDER_POOL="gpu",
        FATURA_MAX_OUTPUT_TOKENS=str(MAX_OUTPUT),
        FATURA_SANDBOX_PROVIDER_MODE="vllm",
        FATURA_SANDBOX_VLLM_KV_BLOCKS=str(KV_BLOCKS),
        FATURA_SANDBOX_VLLM_BLOCK_SIZE=str(BLOCK_SIZE),
        FATURA_ATTEMPT_DEADLINE_SECONDS="30",
    )
    pipeline.start_processing()
    yield pipeline


def padded(text: str, chars: int) -> str:
    return text + "\n" + PADDING * (chars // len(PADDING))


def test_short_and_long_documents_share_the_kv_cache_and_one_that_never_fits_fails_clearly(
    pipe: Pipeline,
) -> None:
    """Given a local pool of 8,000 KV tokens and max_tokens 1,000
    When short invoices, a ~6,000-token one (prompt + max output fits, but no short one fits beside
    it) and a ~10,000-token one are submitted together
    Then the short and the long ones end with an extraction, one attempt each whose time to first
    token and inter-token latency are kept, the pool holds nothing afterwards and its tokens are
    the usage the provider reported; the one bigger than the whole cache is FAILED_TERMINAL at
    once, with no attempt and a typed error saying why."""
    tenant = pipe.make_tenant()
    text = sample_text("02_de_buerotechnik_eur.txt")
    shorts = [pipe.submit(tenant, text) for _ in range(3)]
    long_job = pipe.submit(tenant, padded(text, 24_000))
    too_long = pipe.submit(tenant, padded(text, 40_000))
    shorts += [pipe.submit(tenant, text) for _ in range(2)]

    failed = pipe.wait_state(too_long, TERMINAL, timeout=60)
    assert failed["state"] == "FAILED_TERMINAL"
    assert failed["error_class"] == "document_too_large_for_model"
    assert "can never fit local pool 'gpu'" in failed["error_message"]
    assert pipe.attempts(too_long) == []
    with pipe.client() as client:
        status = client.get(f"/v1/extraction-jobs/{too_long}", headers=tenant.headers).json()
    assert status["done"] is True and status["error"]["class"] == "document_too_large_for_model"
    assert "too long for the model" in status["error"]["message"]

    finished = {job_id: pipe.wait_state(job_id, TERMINAL, timeout=120) for job_id in [*shorts, long_job]}
    assert {job["state"] for job in finished.values()} <= {"SUCCEEDED", "REVIEW_REQUIRED"}
    reported = 0
    for job_id in finished:
        attempts = pipe.attempts(job_id)
        assert [a["outcome"] for a in attempts] == ["ok"], attempts
        # The server streamed the answer token by token: the attempt keeps both latencies.
        assert 0 <= attempts[0]["time_to_first_token_ms"] <= attempts[0]["latency_ms"]
        assert attempts[0]["inter_token_ms"] > 0
        reported += attempts[0]["input_tokens"] + attempts[0]["output_tokens"]
    assert finished[long_job]["attempt"] == 1
    with pipe.client() as client:
        operator = make_operator(pipe.pool, label="local-pool")
        (seen,) = client.get(f"/v1/ops/jobs/{long_job}", headers=operator.headers).json()["attempts"]
    (kept,) = pipe.attempts(long_job)
    assert seen["time_to_first_token_ms"] == kept["time_to_first_token_ms"]
    assert seen["inter_token_ms"] == kept["inter_token_ms"]

    with LimiterClient(pipe.env["FATURA_LIMITER_ADDRESS"], deadline_ms=2_000) as limiter:
        status_now = limiter.pool_status("gpu")
    assert status_now.in_flight.used == 0
    # Released COMPLETED with the reported usage: the window holds exactly what the provider said.
    assert status_now.tokens.used == reported
