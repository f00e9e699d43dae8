"""The simulated vLLM engine stepped on a fake clock: queueing inside the server, prefill and
decode times, and the preemption (recompute) of the newest sequence when the KV cache is full."""

from __future__ import annotations

from services.sandbox.provider.vllm import Engine, EngineConfig, Sequence


def run(engine: Engine, until: float = 1_000.0) -> float:
    now = 0.0
    while not engine.idle() and now < until:
        now += engine.step(now).duration_s
    return now


def test_requests_beyond_max_num_seqs_wait_inside_the_server() -> None:
    engine = Engine(EngineConfig(kv_blocks=10_000, max_num_seqs=2))
    seqs = [engine.add(100, 10, 0.0) for _ in range(3)]
    engine.step(0.0)
    assert [s.seq_id for s in engine.running] == [seqs[0].seq_id, seqs[1].seq_id]
    assert list(engine.waiting) == [seqs[2]]
    run(engine)
    assert seqs[2].first_token_at is not None and seqs[0].finished_at is not None
    assert seqs[2].first_token_at >= seqs[0].finished_at


def test_prefill_grows_with_the_prompt_and_decode_with_the_output() -> None:
    def latency(prompt: int, output: int) -> tuple[float, float]:
        engine = Engine(EngineConfig(kv_blocks=100_000, max_num_batched_tokens=4_096))
        seq = engine.add(prompt, output, 0.0)
        run(engine)
        assert seq.first_token_at is not None and seq.finished_at is not None
        return seq.first_token_at, seq.finished_at - seq.first_token_at

    short_ttft, short_decode = latency(500, 50)
    long_ttft, long_decode = latency(40_000, 50)
    assert long_ttft > 10 * short_ttft  # chunked prefill: ten steps of 4,096 tokens
    assert abs(long_decode - short_decode) < 1e-9
    _, longer_decode = latency(500, 500)
    assert longer_decode > 9 * short_decode


def test_a_full_cache_preempts_the_newest_sequence_and_recomputes_it() -> None:
    """Given two sequences admitted while their prompts fit, when their outputs grow past the
    cache, then the newer one is preempted (its blocks freed), waits, is recomputed, and finishes
    later than it would have; the older one never is."""
    engine = Engine(EngineConfig(kv_blocks=20, block_size=16, max_num_seqs=8))
    old = engine.add(120, 100, 0.0)
    new = engine.add(120, 100, 0.0)
    now = 0.0
    preempted: list[Sequence] = []
    while not engine.idle():
        result = engine.step(now)
        preempted += result.preempted
        now += result.duration_s
    assert preempted and all(seq is new for seq in preempted)
    assert old.preemptions == 0 and new.preemptions >= 1
    assert engine.preemptions_total == len(preempted)
    assert new.finished_at is not None and old.finished_at is not None
    assert new.finished_at > old.finished_at
    assert new.generated == 100 and engine.blocks_used == 0


def test_admitted_within_the_kv_budget_nothing_is_preempted() -> None:
    """Prompt + max output of everything running fits the cache: the batch never outgrows it."""
    engine = Engine(EngineConfig(kv_blocks=64, block_size=16, max_num_seqs=8))
    for _ in range(4):
        engine.add(200, 50, 0.0)  # 250 tokens = 16 blocks each, 64 in all
    peak = 0.0
    now = 0.0
    while not engine.idle():
        now += engine.step(now).duration_s
        peak = max(peak, engine.cache_usage)
    assert engine.preemptions_total == 0
    assert 0.9 < peak <= 1.0


def test_a_request_bigger_than_the_cache_can_never_fit() -> None:
    engine = Engine(EngineConfig(kv_blocks=10, block_size=16))
    assert engine.can_ever_fit(100, 60)
    assert not engine.can_ever_fit(100, 61)


def test_the_vllm_mode_answers_through_the_engine_and_serves_vllms_metric_names() -> None:
    import asyncio

    import httpx

    from services.sandbox.provider.app import create_app
    from services.sandbox.provider.settings import ProviderSettings

    settings = ProviderSettings.from_env(
        {"FATURA_SANDBOX_PROVIDER_MODE": "vllm", "FATURA_SANDBOX_VLLM_KV_BLOCKS": "100"}
    )
    app = create_app(settings)

    async def scenario() -> tuple[list[int], str]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as client:

            def ask(text: str, max_tokens: int) -> dict[str, object]:
                messages = [{"role": "user", "content": text}]
                return {"model": "fatura-sim-1", "messages": messages, "max_tokens": max_tokens}

            answers = await asyncio.gather(
                *(
                    client.post("/v1/chat/completions", json=ask("Invoice INV-1 total 10.00 EUR", 300))
                    for _ in range(3)
                ),
                client.post("/v1/chat/completions", json=ask("x" * 8_000, 10)),  # 2,000 tokens > 1,600
            )
            metrics = (await client.get("/metrics")).text
        return [a.status_code for a in answers], metrics

    statuses, metrics = asyncio.run(scenario())
    assert statuses == [200, 200, 200, 400]
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:gpu_cache_usage_perc",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
    ):
        assert name in metrics, name


def test_two_long_prompts_prefilled_in_chunks_never_hold_the_cache_forever() -> None:
    engine = Engine(EngineConfig(kv_blocks=100, block_size=16, max_num_batched_tokens=512))
    first = engine.add(1_400, 20, 0.0)
    second = engine.add(1_400, 20, 0.0)
    run(engine, until=100.0)
    assert engine.idle() and first.finished_at is not None and second.finished_at is not None
    assert first.preemptions == 0 and second.preemptions >= 1
