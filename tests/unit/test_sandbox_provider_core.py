"""The simulated provider's pure parts: its limits on a fake clock, fault requests, the wire format."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.common.settings import SettingsError
from services.inference.prompt import build_messages
from services.sandbox.provider.chat import Simulator
from services.sandbox.provider.faults import Fault, FaultBoard, FaultError, parse_fault
from services.sandbox.provider.limits import Limits
from services.sandbox.provider.settings import ProviderSettings
from services.sandbox.provider.wire import RequestError, parse_request


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rpm_is_a_sliding_minute_and_retry_after_says_when_the_oldest_request_leaves() -> None:
    clock = Clock()
    limits = Limits(rpm=2, tpm=0, concurrency=0, clock=clock)
    assert limits.admit(10) is None
    clock.now += 20
    assert limits.admit(10) is None
    limits.release(), limits.release()

    clock.now += 10  # 30 s after the first request
    denial = limits.admit(10)
    assert denial is not None and (denial.limit, denial.retry_after_s) == ("rpm", 30)

    clock.now += 30  # the first request has left the window
    assert limits.admit(10) is None


def test_tpm_counts_tokens_in_the_window_and_a_request_over_the_whole_limit_is_refused() -> None:
    clock = Clock()
    limits = Limits(rpm=0, tpm=1000, concurrency=0, clock=clock)
    assert limits.admit(600) is None
    clock.now += 15
    denial = limits.admit(600)
    assert denial is not None and (denial.limit, denial.retry_after_s) == ("tpm", 45)
    assert limits.admit(400) is None  # still fits
    too_large = limits.admit(1001)
    assert too_large is not None and too_large.limit == "tpm" and "too large" in too_large.message


def test_concurrency_counts_requests_in_progress_and_a_denial_takes_nothing() -> None:
    limits = Limits(rpm=0, tpm=0, concurrency=1, clock=Clock())
    assert limits.admit(1) is None
    denial = limits.admit(1)
    assert denial is not None and (denial.limit, denial.retry_after_s) == ("concurrency", 1)
    assert limits.in_flight == 1
    limits.release()
    assert limits.admit(1) is None


def test_per_second_quantizes_rpm_even_with_the_minute_under_its_limit() -> None:
    """Given 600 RPM enforced per second (a bucket of 10 requests refilled at 10 a second)
    Then 10 requests at once pass and the 11th is refused with Retry-After 1; a request passes
    again once the bucket refilled one, a steady 10 a second always passes, a faster pace does not,
    and without the option the same burst passes."""
    clock = Clock()
    limits = Limits(rpm=600, tpm=0, concurrency=0, clock=clock, per_second=True)
    assert all(limits.admit(1) is None for _ in range(10))
    denial = limits.admit(1)
    assert denial is not None and (denial.limit, denial.retry_after_s) == ("rpm_second", 1)
    assert "600 requests per minute, enforced as 10 requests per second" in denial.message
    assert limits.usage()["requests_in_window"] == 10  # a denial takes nothing
    clock.now += 0.1
    assert limits.admit(1) is None
    assert limits.admit(1) is not None
    assert paced(limits, clock, 0.1, 30) == 30
    assert 0 < paced(limits, clock, 0.09, 30) < 30
    unquantized = Limits(rpm=600, tpm=0, concurrency=0, clock=Clock())
    assert all(unquantized.admit(1) is None for _ in range(100))


def paced(limits: Limits, clock: Clock, every: float, count: int) -> int:
    """Requests admitted out of ``count`` sent ``every`` seconds apart."""
    admitted = 0
    for _ in range(count):
        clock.now += every
        admitted += limits.admit(1) is None
    return admitted


def test_per_second_quantizes_tpm_and_a_large_request_needs_a_full_bucket() -> None:
    clock = Clock()
    limits = Limits(rpm=0, tpm=60_000, concurrency=0, clock=clock, per_second=True)  # 1000 a second
    assert limits.admit(600) is None
    denial = limits.admit(600)
    assert denial is not None and (denial.limit, denial.retry_after_s) == ("tpm_second", 1)
    assert limits.admit(400) is None  # still fits the bucket
    clock.now += 0.5  # 500 tokens back
    assert limits.admit(1_500) is not None  # over a second's worth: needs the bucket full
    clock.now += 0.5
    assert limits.admit(1_500) is None
    assert limits.admit(1) is not None  # the bucket is 500 tokens in debt


def test_zero_means_unlimited() -> None:
    limits = Limits(rpm=0, tpm=0, concurrency=0, clock=Clock())
    assert all(limits.admit(10**9) is None for _ in range(1000))


def test_a_fault_with_a_count_faults_that_many_answers_then_clears_itself() -> None:
    board = FaultBoard(random.Random(1))
    board.set(parse_fault({"mode": "server_error", "count": 2, "status": 502}))
    drawn = [board.draw() for _ in range(3)]
    assert [f.status if f else None for f in drawn] == [502, 502, None]
    assert board.to_json()["mode"] == "none"


def test_a_fault_given_back_unused_is_not_spent() -> None:
    board = FaultBoard(random.Random(1))
    board.set(parse_fault({"mode": "broken_json", "count": 1}))
    fault = board.draw()
    assert fault is not None and board.active is None
    board.give_back(fault)
    assert board.draw() == fault


def test_probability_zero_never_faults_and_null_count_faults_until_cleared() -> None:
    board = FaultBoard(random.Random(1))
    board.set(parse_fault({"mode": "rate_limit_storm", "probability": 0}))
    assert all(board.draw() is None for _ in range(100))
    board.set(parse_fault({"mode": "rate_limit_storm", "count": None}))
    assert all(board.draw() is not None for _ in range(100))
    board.set(parse_fault({"mode": "none"}))
    assert board.draw() is None


def test_fault_defaults_follow_the_mode() -> None:
    assert parse_fault({"mode": "hang_before_headers"}).delay_s == 600
    assert parse_fault({"mode": "slow_stream"}).delay_s == 1
    assert parse_fault({"mode": "server_error"}) == Fault("server_error", None, 1.0, 1, 0.0, 503)


@pytest.mark.parametrize(
    "body",
    [
        [],
        {"mode": "melt_down"},
        {"mode": "server_error", "status": 404},
        {"mode": "server_error", "count": 0},
        {"mode": "server_error", "count": True},
        {"mode": "slow_stream", "probability": 1.5},
        {"mode": "slow_stream", "delay_s": -1},
        {"mode": "none", "colour": "red"},
    ],
)
def test_a_fault_request_that_makes_no_sense_is_refused(body: Any) -> None:
    with pytest.raises(FaultError):
        parse_fault(body)


GOOD = {"model": "fatura-sim-1", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body",
    [
        "not an object",
        {"messages": GOOD["messages"]},
        {"model": "fatura-sim-1", "messages": []},
        {"model": "fatura-sim-1", "messages": [{"content": "no role"}]},
        {"model": "fatura-sim-1", "messages": [{"role": "user", "content": 42}]},
        {**GOOD, "stream": "yes"},
        {**GOOD, "max_tokens": 0},
        {**GOOD, "n": 2},
        {**GOOD, "temperature": "hot"},
        {**GOOD, "stream_options": "usage"},
    ],
)
def test_a_malformed_chat_request_is_a_400_naming_the_problem(body: Any) -> None:
    with pytest.raises(RequestError) as caught:
        parse_request(body)
    assert caught.value.status == 400
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


def test_the_document_is_read_from_inside_the_fence_or_else_the_whole_last_user_message() -> None:
    fenced = build_messages("INVOICE 1", nonce="0123456789abcdef")
    assert parse_request({**GOOD, "messages": fenced}).document == "INVOICE 1"
    parts = [{"type": "text", "text": "INVOICE 2"}]
    assert parse_request({**GOOD, "messages": [{"role": "user", "content": parts}]}).document == "INVOICE 2"


def test_settings_fail_fast_by_name_and_default_to_no_limits() -> None:
    defaults = ProviderSettings.from_env({})
    assert (defaults.port, defaults.rpm, defaults.tpm, defaults.concurrency) == (8090, 0, 0, 0)
    assert defaults.models == ("fatura-sim-1",) and defaults.api_key is None
    with pytest.raises(SettingsError, match="FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION"):
        ProviderSettings.from_env({"FATURA_SANDBOX_PROVIDER_LATENCY_DISTRIBUTION": "gaussian"})
    with pytest.raises(SettingsError, match="FATURA_SANDBOX_PROVIDER_RPM"):
        ProviderSettings.from_env({"FATURA_SANDBOX_PROVIDER_RPM": "-1"})


@pytest.mark.parametrize("distribution", ["fixed", "exponential", "lognormal"])
def test_latency_draws_have_the_configured_mean(distribution: Any) -> None:
    settings = ProviderSettings(latency_ms=200, latency_distribution=distribution)
    sim = Simulator(settings, Limits(0, 0, 0), rng=random.Random(7))
    draws = [sim.latency_s() for _ in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(0.2, rel=0.05)
    assert (len(set(draws)) == 1) == (distribution == "fixed")


def test_zero_latency_is_no_wait_whatever_the_distribution() -> None:
    sim = Simulator(ProviderSettings(latency_ms=0, latency_distribution="lognormal"), Limits(0, 0, 0))
    assert sim.latency_s() == 0
