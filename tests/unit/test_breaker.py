"""The per-channel circuit breaker: 3 failures in 5 minutes open a channel for 60 s, then one
trial call decides (seed 001, layer 1). The pure machine is tested directly; the Redis script that
every worker shares is driven through the same steps and must agree with it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.inference.providers.breaker import BreakerState, Report, Verdict, admit, report
from services.inference.providers.breaker_store import RedisBreakers, connect
from services.inference.providers.settings import BreakerPolicy

POLICY = BreakerPolicy(failures=3, window_ms=300_000, cooldown_ms=60_000, trial_ms=45_000)
TEST_REDIS = "redis://127.0.0.1:6379/14"


def fail(state: BreakerState, now: int, *, trial: bool = False) -> BreakerState:
    return report(state, now, POLICY, Report.FAILURE, trial=trial)


def test_a_channel_stays_closed_below_three_failures() -> None:
    state = fail(fail(BreakerState(), 0), 1_000)
    admission, _ = admit(state, 2_000, POLICY)
    assert admission.verdict is Verdict.CLOSED


def test_three_failures_within_five_minutes_open_the_channel_for_sixty_seconds() -> None:
    # Given three failures within the window
    state = fail(fail(fail(BreakerState(), 0), 100_000), 200_000)
    # Then the channel is skipped, and says for how long
    admission, _ = admit(state, 210_000, POLICY)
    assert admission.verdict is Verdict.OPEN
    assert admission.wait_ms == 50_000


def test_failures_older_than_the_window_are_forgotten() -> None:
    state = fail(fail(BreakerState(), 0), 1_000)
    state = fail(state, 301_000)  # the first failure has aged out
    assert admit(state, 301_001, POLICY)[0].verdict is Verdict.CLOSED


def test_after_the_cooldown_one_trial_call_goes_and_the_others_wait() -> None:
    state = fail(fail(fail(BreakerState(), 0), 1), 2)
    first, state = admit(state, 60_002, POLICY)
    second, state = admit(state, 60_003, POLICY)
    assert first.verdict is Verdict.TRIAL
    assert second.verdict is Verdict.OPEN


def test_a_successful_trial_closes_the_channel_and_forgets_its_failures() -> None:
    state = fail(fail(fail(BreakerState(), 0), 1), 2)
    _, state = admit(state, 60_002, POLICY)
    state = report(state, 60_100, POLICY, Report.SUCCESS, trial=True)
    assert state == BreakerState()
    assert admit(fail(state, 60_200), 60_201, POLICY)[0].verdict is Verdict.CLOSED


def test_a_failed_trial_opens_the_channel_again_at_once() -> None:
    state = fail(fail(fail(BreakerState(), 0), 1), 2)
    _, state = admit(state, 60_002, POLICY)
    state = fail(state, 60_100, trial=True)
    admission, _ = admit(state, 60_101, POLICY)
    assert admission.verdict is Verdict.OPEN
    assert admission.wait_ms == 59_999


def test_a_trial_whose_worker_vanished_is_given_to_another_caller_later() -> None:
    state = fail(fail(fail(BreakerState(), 0), 1), 2)
    _, state = admit(state, 60_002, POLICY)
    admission, _ = admit(state, 60_002 + POLICY.trial_ms, POLICY)
    assert admission.verdict is Verdict.TRIAL


def test_successes_outside_a_trial_do_not_hide_a_channel_that_fails_every_other_call() -> None:
    state = BreakerState()
    for t in range(0, 6_000, 1_000):
        state = fail(state, t) if t % 2000 == 0 else report(state, t, POLICY, Report.SUCCESS, trial=False)
    assert admit(state, 6_000, POLICY)[0].verdict is Verdict.OPEN


# --- the shared store runs the same machine ---------------------------------------------------


@pytest.fixture(scope="module")
def breakers() -> Iterator[RedisBreakers]:
    client = redis.Redis.from_url(TEST_REDIS)
    prefix = f"test:breaker:{uuid.uuid4().hex[:8]}"
    yield RedisBreakers(client, prefix, POLICY)
    for key in client.scan_iter(f"{prefix}:*"):
        client.delete(key)
    client.close()


STEP = st.tuples(
    st.integers(min_value=0, max_value=90_000),  # ms since the previous step
    st.sampled_from(["admit", "failure", "success", "release"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(STEP, min_size=1, max_size=25))
def test_the_redis_script_agrees_with_the_pure_machine(
    breakers: RedisBreakers, steps: list[tuple[int, str]]
) -> None:
    channel = uuid.uuid4().hex
    state, now, trial = BreakerState(), 1_000_000, False
    for gap, op in steps:
        now += gap
        if op == "admit":
            expected, state = admit(state, now, POLICY)
            got = breakers.admit(channel, now_ms=now)
            assert got == expected
            trial = expected.verdict is Verdict.TRIAL
        else:
            state = report(state, now, POLICY, Report(op), trial=trial)
            breakers.report(channel, Report(op), trial=trial, now_ms=now)
            trial = False
        assert breakers.failures(channel, now_ms=now) == len(
            [t for t in state.failures if now - t < POLICY.window_ms]
        )


def test_an_unreachable_store_lets_every_channel_be_tried() -> None:
    # Given a breaker store whose Redis does not answer
    dead = RedisBreakers(connect("redis://127.0.0.1:1/0", timeout_s=0.05), "test:breaker:dead", POLICY)
    # Then the breaker fails open: the limiter, not the breaker, guards the provider
    assert dead.admit("any").verdict is Verdict.CLOSED
    assert dead.report("any", Report.FAILURE, trial=False) is Verdict.CLOSED


def test_a_process_remembers_only_a_spotless_channel_and_forgets_it_on_its_own_failure() -> None:
    client = redis.Redis.from_url(TEST_REDIS)
    prefix = f"test:breaker:{uuid.uuid4().hex[:8]}"
    try:
        # Given two worker processes' breakers over one Redis, both caching healthy channels
        a = RedisBreakers(client, prefix, POLICY, healthy_cache_ms=60_000)
        b = RedisBreakers(client, prefix, POLICY, healthy_cache_ms=60_000)
        # When A fails once it asks Redis again, and a channel with a recent failure is not cached
        assert a.admit("ch").verdict is Verdict.CLOSED
        a.report("ch", Report.FAILURE, trial=False)
        assert a.admit("ch").verdict is Verdict.CLOSED
        # Then the failures B sees open the channel for A at once
        b.report("ch", Report.FAILURE, trial=False)
        b.report("ch", Report.FAILURE, trial=False)
        assert a.admit("ch").verdict is Verdict.OPEN
    finally:
        for key in client.scan_iter(f"{prefix}:*"):
            client.delete(key)
        client.close()
