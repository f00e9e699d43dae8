"""The simulated provider as a real process (``fatura run provider``), called by the official
``openai`` client and by plain HTTP: answers, limits, faults, bad requests, counts."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpx
import openai
import pytest
from stdnum import iban as stdnum_iban

from fix_processes import ServiceProcess, SpawnFn
from services.common.procs import free_port, stop_all
from services.inference.prompt import build_messages
from services.inference.validation import resolve_span
from services.sandbox.provider.extract import extract
from services.sandbox.samples import load_samples

SAMPLES = {s.filename[:2]: s for s in load_samples()}
MODEL = "fatura-sim-1"


def start_provider(spawn: SpawnFn, **env: str) -> ServiceProcess:
    """Started, not yet waited for: several start side by side."""
    port = free_port()
    provider = spawn("provider", FATURA_SANDBOX_PROVIDER_PORT=str(port), **env)
    provider.base_url = f"http://127.0.0.1:{port}"
    return provider


def client_for(provider: ServiceProcess, key: str = "sk-anything", timeout: float = 10.0) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{provider.base_url}/v1", api_key=key, max_retries=0, timeout=timeout)


def stats(provider: ServiceProcess) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{provider.base_url}/admin/stats").json()
    return body


def set_fault(provider: ServiceProcess, **fault: Any) -> None:
    response = httpx.post(f"{provider.base_url}/admin/faults", json=fault)
    assert response.status_code == 200, response.text


def wait_for(condition: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


PROVIDERS = {
    "default": {},
    "keyed": {"FATURA_SANDBOX_PROVIDER_API_KEY": "sk-sim-secret"},
    "rpm": {"FATURA_SANDBOX_PROVIDER_RPM": "2"},
    "tpm": {"FATURA_SANDBOX_PROVIDER_TPM": "1200"},
    # buckets of 2 requests and 1,000 tokens a second, while the minute allows 120 and 60,000
    "per_second": {
        "FATURA_SANDBOX_PROVIDER_RPM": "120",
        "FATURA_SANDBOX_PROVIDER_TPM": "60000",
        "FATURA_SANDBOX_PROVIDER_PER_SECOND": "1",
    },
    "slow": {"FATURA_SANDBOX_PROVIDER_CONCURRENCY": "2", "FATURA_SANDBOX_PROVIDER_LATENCY_MS": "2000"},
}


@pytest.fixture(scope="module")
def providers(spawn: SpawnFn) -> Iterator[dict[str, ServiceProcess]]:
    """One provider process per configuration, started together; ended by pid afterwards."""
    started = {name: start_provider(spawn, **env) for name, env in PROVIDERS.items()}
    for process in started.values():
        process.wait_ready(f"{process.base_url}/readyz")
    yield started
    stop_all(list(started.values()))


@pytest.fixture
def provider(providers: dict[str, ServiceProcess]) -> ServiceProcess:
    return providers["default"]


@pytest.fixture
def sim(provider: ServiceProcess) -> Iterator[ServiceProcess]:
    """The shared provider with no fault and fresh counts; the fault is cleared afterwards too."""
    httpx.delete(f"{provider.base_url}/admin/faults")
    httpx.delete(f"{provider.base_url}/admin/stats")
    yield provider
    httpx.delete(f"{provider.base_url}/admin/faults")


def test_the_openai_client_gets_the_extraction_labelled_as_a_simulator(sim: ServiceProcess) -> None:
    # Given a sample invoice in the worker's fenced prompt
    sample = SAMPLES["01"]
    # When the official client asks for a completion
    raw = client_for(sim).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=build_messages(sample.text),
        temperature=0,
    )
    answer = raw.parse()
    # Then the content is the rule-based extraction, and the answer says it is a simulator
    assert json.loads(answer.choices[0].message.content or "") == extract(sample.text)
    assert answer.system_fingerprint == "fatura-sandbox-simulator"
    assert raw.headers["x-fatura-simulator"] == "fatura-sandbox-simulator"
    assert answer.choices[0].finish_reason == "stop"
    usage = answer.usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens > 0
    assert stats(sim)["by_outcome"] == {"ok": 1}


def test_a_stream_carries_the_same_answer_in_chunks_then_usage(sim: ServiceProcess) -> None:
    sample = SAMPLES["11"]
    stream = client_for(sim).chat.completions.create(
        model=MODEL,
        messages=build_messages(sample.text),
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert json.loads(content) == extract(sample.text)
    assert len([c for c in chunks if c.choices]) > 3
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_the_raw_stream_ends_with_done(sim: ServiceProcess) -> None:
    body = {"model": MODEL, "messages": build_messages(SAMPLES["02"].text), "stream": True}
    with httpx.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        frames = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "stop"


def test_models_are_listed_and_an_unknown_model_is_a_404(sim: ServiceProcess) -> None:
    client = client_for(sim)
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-99", messages=[{"role": "user", "content": "x"}])
    assert caught.value.code == "model_not_found"
    assert stats(sim)["by_outcome"] == {"model_not_found": 1}


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b'{"model": "fatura-sim-1"}',
        b'{"model": "fatura-sim-1", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}',
        b'{"model": "fatura-sim-1", "messages": [{"role": "user", "content": "x"}], "n": 3}',
    ],
)
def test_a_malformed_request_is_a_400_json_error(sim: ServiceProcess, body: bytes) -> None:
    response = httpx.post(f"{sim.base_url}/v1/chat/completions", content=body)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert stats(sim)["by_outcome"] == {"bad_request": 1}


def test_a_required_key_refuses_any_other_with_401(providers: dict[str, ServiceProcess]) -> None:
    provider = providers["keyed"]
    messages = build_messages(SAMPLES["03"].text)
    with pytest.raises(openai.AuthenticationError):
        client_for(provider, key="sk-wrong").chat.completions.create(model=MODEL, messages=messages)
    answer = client_for(provider, key="sk-sim-secret").chat.completions.create(model=MODEL, messages=messages)
    assert answer.choices[0].message.content
    assert stats(provider)["by_outcome"] == {"ok": 1, "unauthorized": 1}


def test_over_rpm_is_a_429_with_retry_after_and_counted(providers: dict[str, ServiceProcess]) -> None:
    provider = providers["rpm"]
    client = client_for(provider)
    messages = build_messages(SAMPLES["04"].text)
    for _ in range(2):
        client.chat.completions.create(model=MODEL, messages=messages)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=messages)
    assert 1 <= int(caught.value.response.headers["retry-after"]) <= 60
    assert caught.value.code == "rate_limit_exceeded"
    counted = stats(provider)
    assert counted["by_outcome"] == {"ok": 2, "limited_rpm": 1}
    assert counted["requests_in_window"] == 2
    metrics = httpx.get(f"{provider.base_url}/metrics").text
    assert 'fatura_sandbox_provider_requests_total{outcome="limited_rpm"} 1.0' in metrics


def test_over_tpm_is_a_429_with_retry_after(providers: dict[str, ServiceProcess]) -> None:
    provider = providers["tpm"]
    client = client_for(provider)
    messages = build_messages(SAMPLES["04"].text)  # about 700 tokens with the answer
    client.chat.completions.create(model=MODEL, messages=messages)
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model=MODEL, messages=messages)
    assert int(caught.value.response.headers["retry-after"]) >= 1
    assert stats(provider)["by_outcome"] == {"ok": 1, "limited_tpm": 1}


def test_per_second_quantizing_answers_a_burst_with_429_while_the_minute_is_under_its_limit(
    providers: dict[str, ServiceProcess],
) -> None:
    """Given RPM 120 and TPM 60,000 enforced per second (buckets of 2 requests, 1,000 tokens)
    When requests of about 350 tokens come as fast as one client sends them
    Then a bucket refuses with 429 and Retry-After: 1, by tokens or requests, and the provider
    still counts its minute far under both limits."""
    provider = providers["per_second"]
    messages = build_messages(SAMPLES["03"].text)
    body = {"model": MODEL, "messages": messages, "max_tokens": 16}
    with httpx.Client(base_url=provider.base_url, timeout=30.0) as client:
        answers = [client.post("/v1/chat/completions", json=body) for _ in range(4)]
    statuses = [a.status_code for a in answers]
    assert statuses[0] == 200 and 429 in statuses
    for answer in answers:
        if answer.status_code == 429:
            assert answer.headers["retry-after"] == "1"
            assert answer.json()["error"]["code"] == "rate_limit_exceeded"
            assert "per second" in answer.json()["error"]["message"]
    counted = stats(provider)
    limited = {k: v for k, v in counted["by_outcome"].items() if k.startswith("limited_")}
    assert set(limited) <= {"limited_rpm_second", "limited_tpm_second"} and sum(limited.values()) >= 1
    assert counted["requests_in_window"] == statuses.count(200) < 120


def test_over_concurrency_is_a_429_while_slow_requests_are_in_progress(
    providers: dict[str, ServiceProcess],
) -> None:
    # Given a provider that takes two requests at once, each answered after a while
    provider = providers["slow"]
    messages = build_messages(SAMPLES["05"].text)
    answers: list[str] = []

    def call() -> None:
        answer = client_for(provider).chat.completions.create(model=MODEL, messages=messages)
        answers.append(answer.choices[0].message.content or "")

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    # When both are in progress and a third arrives
    wait_for(lambda: stats(provider)["in_flight"] == 2, "two requests in progress")
    with pytest.raises(openai.RateLimitError) as caught:
        client_for(provider).chat.completions.create(model=MODEL, messages=messages)
    # Then the third is refused with Retry-After, and the two still finish
    assert caught.value.response.headers["retry-after"] == "1"
    for thread in threads:
        thread.join()
    assert len(answers) == 2
    counted = stats(provider)
    assert counted["by_outcome"] == {"ok": 2, "limited_concurrency": 1}
    assert (counted["peak_in_flight"], counted["in_flight"]) == (2, 0)


def test_rate_limit_storm_answers_429_for_its_count_then_recovers(sim: ServiceProcess) -> None:
    set_fault(sim, mode="rate_limit_storm", count=2, retry_after=7)
    client = client_for(sim)
    messages = build_messages(SAMPLES["01"].text)
    for _ in range(2):
        with pytest.raises(openai.RateLimitError) as caught:
            client.chat.completions.create(model=MODEL, messages=messages)
        assert caught.value.response.headers["retry-after"] == "7"
    assert client.chat.completions.create(model=MODEL, messages=messages).choices
    assert stats(sim)["by_outcome"] == {"fault_rate_limit_storm": 2, "ok": 1}


def test_server_error_answers_the_status_asked_for(sim: ServiceProcess) -> None:
    set_fault(sim, mode="server_error", count=1, status=502)
    with pytest.raises(openai.InternalServerError) as caught:
        client_for(sim).chat.completions.create(model=MODEL, messages=build_messages(SAMPLES["01"].text))
    assert caught.value.status_code == 502
    assert httpx.get(f"{sim.base_url}/admin/faults").json()["mode"] == "none"


def test_hang_before_headers_sends_nothing_until_the_client_gives_up(sim: ServiceProcess) -> None:
    # Given a provider that accepts and then sends nothing for 30 s
    set_fault(sim, mode="hang_before_headers", count=1, delay_s=30)
    # When a client with a short timeout calls it
    with pytest.raises(openai.APITimeoutError):
        client_for(sim, timeout=0.5).chat.completions.create(
            model=MODEL,
            messages=build_messages(SAMPLES["01"].text),
        )
    # Then the call was received and counted, and its slot is freed once the client has gone
    assert stats(sim)["by_outcome"] == {"fault_hang_before_headers": 1}
    wait_for(lambda: stats(sim)["in_flight"] == 0, "the abandoned request left")


def test_slow_stream_is_a_healthy_stream_with_pauses(sim: ServiceProcess) -> None:
    set_fault(sim, mode="slow_stream", count=1, delay_s=0.05)
    sample = SAMPLES["03"]
    stream = client_for(sim).chat.completions.create(
        model=MODEL,
        messages=build_messages(sample.text),
        stream=True,
    )
    content = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert json.loads(content) == extract(sample.text)
    assert stats(sim)["by_outcome"] == {"fault_slow_stream": 1}


def test_slow_stream_trips_a_client_read_timeout_between_chunks(sim: ServiceProcess) -> None:
    set_fault(sim, mode="slow_stream", count=1, delay_s=5)
    body = {"model": MODEL, "messages": build_messages(SAMPLES["03"].text), "stream": True}
    received: list[str] = []
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream("POST", f"{sim.base_url}/v1/chat/completions", json=body, timeout=1.0) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                received.append(line)
    assert any(line.startswith("data: ") for line in received)


def test_broken_json_is_a_200_whose_content_is_not_json(sim: ServiceProcess) -> None:
    set_fault(sim, mode="broken_json", count=1)
    answer = client_for(sim).chat.completions.create(model=MODEL, messages=build_messages(SAMPLES["02"].text))
    with pytest.raises(json.JSONDecodeError):
        json.loads(answer.choices[0].message.content or "")


def test_hallucinated_iban_is_schema_valid_but_not_in_the_text(sim: ServiceProcess) -> None:
    sample = SAMPLES["14"]
    set_fault(sim, mode="hallucinated_iban", count=1)
    answer = client_for(sim).chat.completions.create(model=MODEL, messages=build_messages(sample.text))
    result = json.loads(answer.choices[0].message.content or "")
    assert stdnum_iban.is_valid(result["supplier"]["iban"])
    assert result["supplier"]["iban"] not in sample.text.replace(" ", "")
    pointed = resolve_span(sample.text, result["evidence"]["/supplier/iban"])  # a made-up span
    assert pointed is not None and result["supplier"]["iban"] not in pointed.replace(" ", "")
    assert extract(sample.text)["supplier"]["iban"] is None  # the honest answer has none


def test_obey_injection_reports_the_iban_the_injected_text_asks_for(sim: ServiceProcess) -> None:
    sample = SAMPLES["08"]
    set_fault(sim, mode="obey_injection", count=1)
    client = client_for(sim)
    obeyed = client.chat.completions.create(model=MODEL, messages=build_messages(sample.text))
    honest = client.chat.completions.create(model=MODEL, messages=build_messages(sample.text))
    obeyed_result = json.loads(obeyed.choices[0].message.content or "")
    assert obeyed_result["supplier"]["iban"] == "TR330006100519786457841326"
    assert resolve_span(sample.text, obeyed_result["evidence"]["/supplier/iban"]) == (
        "TR33 0006 1005 1978 6457 8413 26"
    )
    assert (
        json.loads(honest.choices[0].message.content or "")["supplier"]["iban"]
        == "TR710006200001000000123456"
    )


def test_error_frame_is_a_200_stream_whose_first_frame_is_an_error(sim: ServiceProcess) -> None:
    set_fault(sim, mode="error_frame", count=2)
    messages = build_messages(SAMPLES["01"].text)
    # the official client raises on it while reading the stream
    stream = client_for(sim).chat.completions.create(model=MODEL, messages=messages, stream=True)
    with pytest.raises(openai.APIError, match="simulated"):
        list(stream)
    # and a non-streaming request gets a 200 whose body is an error object
    response = httpx.post(f"{sim.base_url}/v1/chat/completions", json={"model": MODEL, "messages": messages})
    assert response.status_code == 200
    assert set(response.json()["error"]) >= {"message", "type", "code"}


def test_a_fault_with_probability_zero_never_fires_and_delete_clears_it(sim: ServiceProcess) -> None:
    set_fault(sim, mode="server_error", probability=0)
    client = client_for(sim)
    messages = build_messages(SAMPLES["01"].text)
    for _ in range(3):
        client.chat.completions.create(model=MODEL, messages=messages)
    assert httpx.get(f"{sim.base_url}/admin/faults").json()["mode"] == "server_error"
    assert httpx.delete(f"{sim.base_url}/admin/faults").json()["mode"] == "none"
    assert stats(sim)["by_outcome"] == {"ok": 3}


@pytest.mark.parametrize("body", [{"mode": "explode"}, {"mode": "server_error", "status": 200}, "[1"])
def test_a_bad_fault_request_is_a_400_and_changes_nothing(sim: ServiceProcess, body: Any) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{sim.base_url}/admin/faults", content=content)
    assert response.status_code == 400
    assert response.json()["error"]["message"]
    assert httpx.get(f"{sim.base_url}/admin/faults").json()["mode"] == "none"


def test_hundreds_of_hanging_requests_are_held_at_once(sim: ServiceProcess) -> None:
    # Given every answer hangs for a while
    set_fault(sim, mode="hang_before_headers", delay_s=4)  # longer than sending 200 takes on a busy machine
    body = {"model": MODEL, "messages": [{"role": "user", "content": "INVOICE"}]}

    async def burst() -> list[int]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(sim.base_url, connector=connector) as session:

            async def call() -> int:
                async with session.post("/v1/chat/completions", json=body) as response:
                    await response.read()
                    return response.status

            return await asyncio.gather(*(call() for _ in range(200)))

    # When 200 arrive together, then all are answered and all were in progress at once
    assert asyncio.run(burst()) == [200] * 200
    assert stats(sim)["peak_in_flight"] == 200
