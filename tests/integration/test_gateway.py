"""The provider gateway against simulated providers running as separate processes (seed 001).

Two ``fatura run provider`` processes are the two channels of one model's chain, cheapest first;
faults are set on them over ``/admin/faults`` and their ``/admin/stats`` count what reached them.
Breaker state is in the test Redis (db 14) under a key prefix of each test's own. The limiter side
is the gateway's own ``Permits`` interface, recorded here so its settlements can be read.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import REGISTRY

from fix_processes import ServiceProcess, SpawnFn
from services.common.procs import free_port
from services.inference.prompt import build_messages
from services.inference.providers import Gateway, GatewaySettings, ProviderRequest, ProviderResult
from services.inference.providers.base import ErrorClass, PermitDenied, PermitGranted
from services.inference.providers.breaker_store import RedisBreakers, connect
from services.inference.providers.cancel import CallScope
from services.inference.providers.catalog import load_catalog
from services.sandbox.samples import SAMPLES_DIR

MODEL = "fatura-sim-1"
TEST_REDIS = "redis://127.0.0.1:6379/14"
INVOICE = (SAMPLES_DIR / "01_tr_kirtasiye_try.txt").read_text(encoding="utf-8")


@dataclass
class Sim:
    """One simulated provider process: a channel."""

    process: ServiceProcess
    url: str

    def fault(self, mode: str, **params: Any) -> None:
        httpx.post(f"{self.url}/admin/faults", json={"mode": mode, **params}).raise_for_status()

    def reset(self) -> None:
        httpx.delete(f"{self.url}/admin/faults").raise_for_status()
        httpx.delete(f"{self.url}/admin/stats").raise_for_status()

    def requests(self) -> int:
        return int(httpx.get(f"{self.url}/admin/stats").json()["requests_total"])


def _start_sim(spawn: SpawnFn, **env: str) -> Sim:
    port = free_port()
    process = spawn("provider", FATURA_SANDBOX_PROVIDER_PORT=str(port), FATURA_LOG_LEVEL="WARNING", **env)
    url = f"http://127.0.0.1:{port}"
    process.wait_ready(f"{url}/readyz")
    return Sim(process, url)


@pytest.fixture(scope="module")
def sims(spawn: SpawnFn) -> tuple[Sim, Sim]:
    return _start_sim(spawn), _start_sim(spawn)


@pytest.fixture
def ch1(sims: tuple[Sim, Sim]) -> Iterator[Sim]:
    sims[0].reset()
    yield sims[0]
    sims[0].reset()


@pytest.fixture
def ch2(sims: tuple[Sim, Sim]) -> Iterator[Sim]:
    sims[1].reset()
    yield sims[1]
    sims[1].reset()


class FixedProvider:
    """A provider that gives every call the same answer (one the simulator does not send), and
    counts the calls."""

    def __init__(self, status: int, content_type: str, body: bytes) -> None:
        self.calls = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                provider.calls += 1
                self.rfile.read(int(self.headers.get("content-length", "0")))
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def refuser(status: int) -> FixedProvider:
    """Every call answered with one error status (the simulator's faults are 5xx only; 402
    insufficient balance needs this)."""
    body = {"error": {"message": "Insufficient balance", "type": "billing", "code": None}}
    return FixedProvider(status, "application/json", json.dumps(body).encode())


def streamer(stream: bytes) -> FixedProvider:
    """Every call answered with one SSE stream, byte for byte (the simulator's extraction reads
    U+2028 as a line break, so it never sends one)."""
    return FixedProvider(200, "text/event-stream", stream)


@dataclass
class RecordingPermits:
    """The worker's limiter permits, as the gateway sees them; ``deny`` refuses a pool."""

    deny: dict[str, int] = field(default_factory=dict)
    acquired: list[str] = field(default_factory=list)
    released: list[tuple[str, str, int, int]] = field(default_factory=list)
    throttled: list[tuple[str, int]] = field(default_factory=list)

    def acquire(self, pool: str) -> PermitGranted | PermitDenied:
        if pool in self.deny:
            return PermitDenied("RPM", self.deny[pool])
        self.acquired.append(pool)
        return PermitGranted(f"{pool}/{len(self.acquired)}")

    def release(self, permit: PermitGranted, outcome: str, input_tokens: int, output_tokens: int) -> None:
        self.released.append((permit.permit_id.split("/")[0], outcome, input_tokens, output_tokens))

    def throttle(self, pool: str, retry_after_ms: int) -> None:
        self.throttled.append((pool, retry_after_ms))


def gateway_for(tmp_path: Path, *urls: str, key_env: str | None = None, **env: str) -> Gateway:
    """A gateway whose chain for MODEL is the given endpoints, cheapest first (pools p1, p2, ...);
    ``key_env`` names the variable holding every channel's API key."""
    lines = [f'default_model = "{MODEL}"']
    names = [f"ch{i}" for i in range(1, len(urls) + 1)]
    for i, (name, url) in enumerate(zip(names, urls, strict=True)):
        lines += [f"[channels.{name}]", f'serves = "{MODEL}"', f'base_url = "{url}/v1"']
        lines += [f"cost = {i}", f'pool = "p{i + 1}"']
        lines += [f'api_key_env = "{key_env}"'] if key_env else []
    lines += [f'[models."{MODEL}"]', f"chain = {json.dumps(names)}"]
    config = tmp_path / f"providers-{uuid.uuid4().hex[:6]}.toml"
    config.write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = GatewaySettings.from_env(
        {
            "FATURA_PROVIDER_CONFIG": str(config),
            "FATURA_REDIS_URL": TEST_REDIS,
            "FATURA_PROVIDER_BREAKER_PREFIX": f"test:gateway:{uuid.uuid4().hex[:8]}",
            "FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS": "1",
            "FATURA_PROVIDER_BREAKER_COOLDOWN_SECONDS": "1",
            **env,
        }
    )
    catalog = load_catalog(settings, env)
    breakers = RedisBreakers(
        connect(settings.redis_url),
        settings.breaker_prefix,
        settings.breaker,
        healthy_cache_ms=settings.breaker_healthy_cache_ms,
    )
    return Gateway(catalog, settings, breakers)


def call(gateway: Gateway, permits: RecordingPermits | None = None, **request: Any) -> ProviderResult:
    fields: dict[str, Any] = {
        "model": MODEL,
        "messages": build_messages(INVOICE),
        "max_output_tokens": 2048,
        "deadline_s": 10.0,
        "request_id": "job-1:1",
        **request,
    }
    return gateway.complete(ProviderRequest(**fields), permits or RecordingPermits())


def outcomes(result: ProviderResult) -> list[tuple[str, str]]:
    return [(h.channel, h.outcome) for h in result.hops]


def test_a_503_on_the_cheapest_channel_fails_over_to_the_next(tmp_path: Path, ch1: Sim, ch2: Sim) -> None:
    # Given channel 1 answers its next call with a 503
    ch1.fault("server_error", count=1, status=503)
    gateway, permits = gateway_for(tmp_path, ch1.url, ch2.url), RecordingPermits()
    # When the worker makes one attempt
    result = call(gateway, permits)
    # Then channel 2 answered, and both hops are reported
    assert result.ok and result.error_class is None
    assert json.loads(result.content or "")["currency"] == "TRY"
    failed, answered = result.hops
    assert (failed.channel, failed.model, failed.http_status, failed.error_class) == (
        "ch1",
        MODEL,
        503,
        ErrorClass.SERVER_ERROR,
    )
    assert (answered.channel, answered.outcome, answered.http_status, answered.answered_model) == (
        "ch2",
        "ok",
        200,
        MODEL,
    )
    assert answered.input_tokens and answered.output_tokens and answered.latency_ms is not None
    assert (ch1.requests(), ch2.requests()) == (1, 1)
    # And each permit is settled: a refusal costs no tokens, the answer costs what it reported
    assert permits.released == [
        ("p1", "COMPLETED", 0, 0),
        ("p2", "COMPLETED", answered.input_tokens, answered.output_tokens),
    ]


def test_three_failures_open_the_breaker_later_calls_skip_it_and_it_closes_after_the_cooldown(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    # Given channel 1 fails every call, and three attempts have met that failure
    ch1.fault("server_error", count=None, status=502)
    gateway = gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_BREAKER_COOLDOWN_SECONDS="3")
    for _ in range(3):
        assert outcomes(call(gateway)) == [("ch1", "server_error"), ("ch2", "ok")]
    assert ch1.requests() == 3
    # When more attempts run while the channel is open
    later = [call(gateway) for _ in range(3)]
    # Then they skip channel 1 before sending anything: it receives no request
    for result in later:
        assert outcomes(result) == [("ch1", "skipped"), ("ch2", "ok")]
        assert result.hops[0].sent is False and result.hops[0].skip_reason == "breaker_open"
    assert ch1.requests() == 3
    # And once channel 1 has recovered and the cooldown has passed, it is tried again and answers
    ch1.reset()
    _wait_until_channel_tried(gateway, ch1)
    assert outcomes(call(gateway)) == [("ch1", "ok")]


def _wait_until_channel_tried(gateway: Gateway, sim: Sim) -> None:
    for _ in range(100):
        result = call(gateway)
        if result.hops[0].outcome != "skipped":
            assert outcomes(result) == [("ch1", "ok")]
            return
        threading.Event().wait(0.1)
    raise AssertionError("the open channel was never tried again")


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_an_answer_counts_its_tokens_and_its_time_to_first_token_per_channel(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    gateway = gateway_for(tmp_path, ch1.url, ch2.url)
    ttft_before = _sample("fatura_provider_time_to_first_token_seconds_count", channel="ch1")
    input_before = _sample("fatura_provider_tokens_total", channel="ch1", kind="input")
    output_before = _sample("fatura_provider_tokens_total", channel="ch1", kind="output")
    # When channel 1 streams an answer
    result = call(gateway)
    (hop,) = result.hops
    assert result.ok and hop.channel == "ch1" and hop.input_tokens and hop.output_tokens
    # Then its time to first token is observed once and the tokens it reported are counted
    assert _sample("fatura_provider_time_to_first_token_seconds_count", channel="ch1") == ttft_before + 1
    assert (
        _sample("fatura_provider_tokens_total", channel="ch1", kind="input")
        == input_before + hop.input_tokens
    )
    assert (
        _sample("fatura_provider_tokens_total", channel="ch1", kind="output")
        == output_before + hop.output_tokens
    )


def test_a_400_is_final_and_not_failed_over(tmp_path: Path, ch1: Sim, ch2: Sim) -> None:
    # When the request itself is bad (no messages), the provider answers 400
    result = call(gateway_for(tmp_path, ch1.url, ch2.url), messages=[])
    # Then the attempt ends there: the same request would be as bad on every channel
    assert result.error_class is ErrorClass.BAD_REQUEST and not result.retryable
    assert outcomes(result) == [("ch1", "bad_request")]
    assert "messages" in (result.error_message or "")
    assert ch2.requests() == 0


def test_a_402_is_final_and_not_failed_over(tmp_path: Path, ch2: Sim) -> None:
    # Given the cheapest channel's account has run out of balance
    broke = refuser(402)
    try:
        result = call(gateway_for(tmp_path, broke.url, ch2.url))
    finally:
        broke.close()
    # Then no retry will fill the wallet: payment required, no failover, no breaker count
    assert result.error_class is ErrorClass.PAYMENT_REQUIRED and not result.retryable
    assert outcomes(result) == [("ch1", "payment_required")]
    assert result.hops[0].http_status == 402
    assert (broke.calls, ch2.requests()) == (1, 0)


def test_a_hang_before_headers_hits_the_header_timeout_and_fails_over(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    # Given channel 1 accepts the connection and then sends nothing for 30 s
    ch1.fault("hang_before_headers", count=1, delay_s=30)
    permits = RecordingPermits()
    result = call(
        gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS="0.5"), permits
    )
    # Then the header timeout ends that hop and channel 2 answers
    assert result.ok
    assert outcomes(result) == [("ch1", "header_timeout"), ("ch2", "ok")]
    # And the first permit keeps its reservation: the request was sent and may have run
    assert permits.released[0] == ("p1", "UNKNOWN", 0, 0)


def test_a_channel_silent_for_whole_attempts_opens_its_breaker_though_the_deadline_ended_them(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    # Given channel 1 hangs before headers, and attempts shorter than the header timeout
    ch1.fault("hang_before_headers", count=None, delay_s=30)
    gateway = gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS="10")
    # When three attempts each spend their whole deadline waiting for its headers
    for _ in range(3):
        result = call(gateway, deadline_s=0.4)
        assert (result.error_class, outcomes(result)) == (ErrorClass.DEADLINE, [("ch1", "deadline_exceeded")])
    # Then the next attempt skips it and channel 2 answers
    assert outcomes(call(gateway)) == [("ch1", "skipped"), ("ch2", "ok")]


def test_a_200_stream_that_opens_with_an_error_frame_fails_over(tmp_path: Path, ch1: Sim, ch2: Sim) -> None:
    ch1.fault("error_frame", count=1)
    result = call(gateway_for(tmp_path, ch1.url, ch2.url))
    assert result.ok
    assert outcomes(result) == [("ch1", "stream_error"), ("ch2", "ok")]
    assert result.hops[0].http_status == 200
    assert ch2.requests() == 1


def test_a_slow_but_healthy_stream_is_committed_and_completes(tmp_path: Path, ch1: Sim, ch2: Sim) -> None:
    # Given channel 1 streams its answer in chunks 0.15 s apart, past a stream gate of 0.1 s
    ch1.fault("slow_stream", count=1, delay_s=0.15)
    result = call(gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_STREAM_GATE_SECONDS="0.1"))
    # Then the gateway waits for it: one hop, the whole answer, nothing sent to channel 2
    assert outcomes(result) == [("ch1", "ok")]
    assert json.loads(result.content or "")["currency"] == "TRY"
    assert ch2.requests() == 0


def test_a_stream_that_outlives_the_attempt_deadline_is_ended_at_the_deadline(
    tmp_path: Path, ch1: Sim
) -> None:
    # Given a stream whose chunks come 1 s apart, and an attempt with 1.5 s to live (the header
    # timeout, which also bounds each read, well above both: with the fixtures' 1 s, a read could
    # time out between two chunks as a connection error just before the deadline)
    ch1.fault("slow_stream", count=1, delay_s=1.0)
    permits = RecordingPermits()
    gateway = gateway_for(tmp_path, ch1.url, FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS="5")
    result = call(gateway, permits, deadline_s=1.5)
    # Then the attempt ends with the deadline (retryable by the schedule), the permit kept as unknown
    assert result.error_class is ErrorClass.DEADLINE and result.retryable and result.sent
    assert permits.released == [("p1", "UNKNOWN", 0, 0)]


@pytest.mark.parametrize(
    ("fault", "delay_s"),
    [("hang_before_headers", 30.0), ("slow_stream", 1.0)],
    ids=["before_headers", "mid_stream"],
)
def test_a_call_whose_job_the_worker_lost_is_cut_at_once_and_not_failed_over(
    tmp_path: Path, ch1: Sim, ch2: Sim, fault: str, delay_s: float
) -> None:
    # Given channel 1 holds the call (no headers yet, or a stream with its chunks a second apart)
    ch1.fault(fault, count=1, delay_s=delay_s)
    gateway = gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS="60")
    scope = CallScope()
    # When the worker loses the job 0.3 s into the call (its heartbeat cancels the scope)
    threading.Timer(0.3, scope.cancel).start()
    started = time.monotonic()
    result = call(gateway, cancel=scope, deadline_s=60.0)
    # Then the call ends at once, as cancelled: no failover, and it counts against no channel
    assert time.monotonic() - started < 5.0
    assert result.error_class is ErrorClass.CANCELLED
    assert outcomes(result) == [("ch1", "cancelled")]
    assert ch2.requests() == 0
    # And the channel's connections still serve the next call
    assert outcomes(call(gateway)) == [("ch1", "ok")]


def test_a_provider_429_is_reported_as_a_throttle_with_its_retry_after(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    ch1.fault("rate_limit_storm", count=1, retry_after=7)
    permits = RecordingPermits()
    result = call(gateway_for(tmp_path, ch1.url, ch2.url), permits)
    assert outcomes(result) == [("ch1", "rate_limited"), ("ch2", "ok")]
    assert (result.hops[0].http_status, result.hops[0].retry_after_ms) == (429, 7_000)
    assert permits.throttled == [("p1", 7_000)]
    assert result.retry_after_ms == 7_000


def test_a_limiter_denial_moves_to_the_next_channel_and_denials_everywhere_defer(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    gateway = gateway_for(tmp_path, ch1.url, ch2.url)
    # A pool without a permit is passed over before anything is sent
    result = call(gateway, RecordingPermits(deny={"p1": 400}))
    assert outcomes(result) == [("ch1", "skipped"), ("ch2", "ok")]
    assert result.hops[0].skip_reason == "limiter:RPM"
    # With no permit anywhere nothing is sent: a deferral by the shortest wait, not an error
    deferred = call(gateway, RecordingPermits(deny={"p1": 400, "p2": 250}))
    assert (deferred.deferred_ms, deferred.error_class, deferred.sent) == (250, None, False)
    assert (ch1.requests(), ch2.requests()) == (0, 1)


def test_an_unknown_model_is_refused_without_a_call(tmp_path: Path, ch1: Sim) -> None:
    result = call(gateway_for(tmp_path, ch1.url), model="gpt-nonexistent")
    assert (result.error_class, result.hops, result.retryable) == (ErrorClass.NOT_FOUND, [], False)
    assert ch1.requests() == 0


def test_the_key_comes_from_the_named_variable_and_a_401_is_not_failed_over(
    tmp_path: Path, spawn: SpawnFn, ch2: Sim
) -> None:
    # Given a provider that accepts only its own key
    locked = _start_sim(spawn, FATURA_SANDBOX_PROVIDER_API_KEY="sk-right")
    try:
        # When the channel's key variable holds that key, the call is answered
        good = gateway_for(tmp_path, locked.url, key_env="ACME_KEY", ACME_KEY="sk-right")
        assert outcomes(call(good)) == [("ch1", "ok")]
        # And with another key it is a 401: final, the next channel is not asked
        bad = gateway_for(tmp_path, locked.url, ch2.url, key_env="ACME_KEY", ACME_KEY="sk-wrong")
        result = call(bad)
        assert (result.error_class, outcomes(result)) == (ErrorClass.UNAUTHORIZED, [("ch1", "unauthorized")])
        assert ch2.requests() == 0
    finally:
        locked.process.stop()


def test_worker_threads_share_one_gateway(tmp_path: Path, ch1: Sim) -> None:
    # Given one gateway per process, as the worker builds it, and eight threads calling at once
    gateway = gateway_for(tmp_path, ch1.url)
    results: list[ProviderResult] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(5):
            result = call(gateway)
            with lock:
                results.append(result)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every call is answered, each thread sending through a connection pool of its own
    assert len(results) == 40 and all(r.ok for r in results)
    assert ch1.requests() == 40


def test_a_streamed_answer_from_a_vllm_server_records_time_to_first_token_and_inter_token_latency(
    tmp_path: Path, spawn: SpawnFn
) -> None:
    """Given a simulated vLLM server, which streams one frame per token as its engine makes them
    When the gateway makes one streamed call
    Then the hop carries its time to first token (within the hop) and its mean inter-token
    latency, and the channel's inter-token histogram counts one gap per frame after the first."""
    vllm = _start_sim(spawn, FATURA_SANDBOX_PROVIDER_MODE="vllm")
    gateway = gateway_for(tmp_path, vllm.url)
    gaps_before = _sample("fatura_provider_inter_token_latency_seconds_count", channel="ch1")
    ttft_before = _sample("fatura_provider_time_to_first_token_seconds_count", channel="ch1")
    result = call(gateway)
    (hop,) = result.hops
    assert result.ok and hop.output_tokens
    assert hop.time_to_first_token_ms is not None and hop.latency_ms is not None
    assert 0 <= hop.time_to_first_token_ms <= hop.latency_ms
    assert hop.inter_token_ms is not None and hop.inter_token_ms > 0
    assert _sample("fatura_provider_time_to_first_token_seconds_count", channel="ch1") == ttft_before + 1
    gaps = _sample("fatura_provider_inter_token_latency_seconds_count", channel="ch1") - gaps_before
    # One frame per token: as many gaps as tokens after the first (a piece per ~4 characters).
    assert hop.output_tokens // 2 <= gaps + 1 <= hop.output_tokens
    vllm.process.stop()


def test_a_stream_longer_than_the_response_cap_is_a_bad_response_and_not_failed_over(
    tmp_path: Path, ch1: Sim, ch2: Sim
) -> None:
    gateway = gateway_for(tmp_path, ch1.url, ch2.url, FATURA_PROVIDER_MAX_RESPONSE_BYTES="1024")
    # When channel 1 streams an answer of more than the 1,024 bytes the gateway reads
    result = call(gateway)
    # Then the hop ends as a bad response counted on the decompressed bytes, and channel 2 is not asked
    assert result.error_class is ErrorClass.BAD_RESPONSE
    assert outcomes(result) == [("ch1", "bad_response")]
    assert result.error_message == "too large"
    assert (ch1.requests(), ch2.requests()) == (1, 0)


def test_a_frame_holding_unicode_line_separators_unescaped_is_read_whole(tmp_path: Path, ch2: Sim) -> None:
    # Given a provider whose answer holds U+2028, U+2029 and NEL raw inside a JSON string (JSON
    # allows them unescaped; SSE ends a line at CR or LF only)
    text = "Toner\u2028HP 85A\u2029x\x85y"
    frames = [
        {"model": MODEL, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    stream = b"".join(b"data: " + json.dumps(f, ensure_ascii=False).encode() + b"\n\n" for f in frames)
    provider = streamer(stream + b"data: [DONE]\n\n")
    try:
        result = call(gateway_for(tmp_path, provider.url, ch2.url))
    finally:
        provider.close()
    # Then the frame is one frame: the answer is the text, from the first channel
    assert outcomes(result) == [("ch1", "ok")]
    assert result.content == text
