"""GCRA pacing in acquire.lua, run on the real Redis (db 14) with the script's clock driven by the
test (``now_ms``), so every count and retry hint below is exact. Races use Redis's own clock."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from services.limiter.config import ConfigError, parse_config
from services.limiter.model import AcquireRequest, Denial, DenyReason, Grant, Outcome
from services.limiter.operations import KeyLayout, LimiterOps, ServerLimits
from services.limiter.store import RedisStore
from tests.limiter.conftest import SHARED_REDIS_URL, delete_prefix

CONFIG = parse_config(
    """
[pools.steady]
rpm = 600
tpm = 1000000000
max_in_flight = 1000
burst_seconds = 0

[pools.bursty]
rpm = 600
tpm = 1000000000
max_in_flight = 1000
burst_seconds = 0.5

[pools.tokens]
rpm = 1000000
tpm = 60000
max_in_flight = 1000
burst_seconds = 0

[pools.windowed]
pacing = "window"
rpm = 10
tpm = 1000000000
max_in_flight = 1000

[pools.race]
rpm = 600
tpm = 1000000000
max_in_flight = 1000
burst_seconds = 1

[pools.gpu]
kind = "local"
rpm = 10
tpm = 1000000000
max_in_flight = 1000
kv_token_capacity = 1000000
"""
)


@pytest.fixture
def ops() -> Iterator[tuple[LimiterOps, RedisStore]]:
    prefix = f"pacetest-{uuid.uuid4().hex[:8]}"
    store = RedisStore(redis.Redis.from_url(SHARED_REDIS_URL))
    yield LimiterOps(lambda: CONFIG, ServerLimits(), KeyLayout(prefix)), store
    store.close()
    delete_prefix(SHARED_REDIS_URL, prefix)


def start_ms() -> int:
    """A whole second of the real clock: keys expire relative to the script's clock, so the test's
    clock starts at the real one and runs ahead of it."""
    return (int(time.time() * 1000) // 1000 + 1) * 1000


def ask(ops: tuple[LimiterOps, RedisStore], pool: str, now_ms: int | None, tokens: int = 1) -> Grant | Denial:
    limiter, store = ops
    request = AcquireRequest(pool, "acme", tokens, 0, 300_000, uuid.uuid4().hex)
    return store.execute(limiter.acquire(request, now_ms))


def test_steady_state_is_one_permit_every_60_over_rpm_seconds(ops: tuple[LimiterOps, RedisStore]) -> None:
    """Given a pool of 600 RPM paced with no burst
    When someone asks every 10 ms for 10 s
    Then exactly one permit per 100 ms is granted, at 0, 100, 200 ... ms."""
    t0 = start_ms()
    granted = [step * 10 for step in range(1000) if isinstance(ask(ops, "steady", t0 + step * 10), Grant)]
    assert granted == list(range(0, 10_000, 100))


def test_a_denial_says_exactly_when_the_pace_allows_the_next(ops: tuple[LimiterOps, RedisStore]) -> None:
    t0 = start_ms()
    assert isinstance(ask(ops, "steady", t0), Grant)
    assert ask(ops, "steady", t0) == Denial(DenyReason.RPM, 100)
    assert ask(ops, "steady", t0 + 37) == Denial(DenyReason.RPM, 63)
    assert ask(ops, "steady", t0 + 99) == Denial(DenyReason.RPM, 1)
    assert isinstance(ask(ops, "steady", t0 + 100), Grant)


def test_the_burst_is_capped_at_its_share_of_a_second(ops: tuple[LimiterOps, RedisStore]) -> None:
    """Given 600 RPM with burst_seconds = 0.5 and an idle pool
    Then 5 permits go at once, the 6th waits one interval, and the pace holds after."""
    t0 = start_ms()
    replies = [ask(ops, "bursty", t0) for _ in range(8)]
    assert sum(isinstance(r, Grant) for r in replies) == 5
    assert replies[5:] == [Denial(DenyReason.RPM, 100)] * 3
    # An idle second later the burst is back, and never more than it.
    later = [ask(ops, "bursty", t0 + 2_000) for _ in range(8)]
    assert sum(isinstance(r, Grant) for r in later) == 5
    granted = [s * 10 for s in range(300) if isinstance(ask(ops, "bursty", t0 + 2_000 + s * 10), Grant)]
    assert granted == list(range(100, 3_000, 100))


def test_tokens_are_paced_by_the_cost_of_each_request(ops: tuple[LimiterOps, RedisStore]) -> None:
    """Given 60,000 TPM (one token a millisecond) and requests reserving 300 tokens
    Then the next request waits 300 ms; a release reporting 100 used gives 200 ms back."""
    limiter, store = ops
    t0 = start_ms()
    first = ask(ops, "tokens", t0, tokens=300)
    assert isinstance(first, Grant)
    assert ask(ops, "tokens", t0 + 1, tokens=5) == Denial(DenyReason.TPM, 299)
    assert isinstance(ask(ops, "tokens", t0 + 300, tokens=300), Grant)  # token TAT now t0 + 600
    store.execute(limiter.release(first.permit_id, Outcome.COMPLETED, 60, 40))
    assert ask(ops, "tokens", t0 + 350, tokens=1) == Denial(DenyReason.TPM, 50)
    assert isinstance(ask(ops, "tokens", t0 + 400, tokens=1), Grant)


def test_a_large_request_is_not_starved_by_small_ones(ops: tuple[LimiterOps, RedisStore]) -> None:
    """The token test does not depend on the size asked: a request for more than the burst goes as
    soon as the token pace has caught up, like any other."""
    t0 = start_ms()
    assert isinstance(ask(ops, "tokens", t0, tokens=10), Grant)
    assert ask(ops, "tokens", t0 + 5, tokens=50_000) == Denial(DenyReason.TPM, 5)
    assert isinstance(ask(ops, "tokens", t0 + 10, tokens=50_000), Grant)
    assert ask(ops, "tokens", t0 + 10, tokens=1) == Denial(DenyReason.TPM, 50_000)


def test_a_request_not_sent_gives_its_turn_back(ops: tuple[LimiterOps, RedisStore]) -> None:
    limiter, store = ops
    t0 = start_ms()
    first = ask(ops, "steady", t0)
    assert isinstance(first, Grant)
    store.execute(limiter.release(first.permit_id, Outcome.NOT_SENT, 0, 0))
    assert isinstance(ask(ops, "steady", t0 + 1), Grant)


def test_a_permit_handed_out_again_keeps_its_turn_when_released_not_sent(
    ops: tuple[LimiterOps, RedisStore],
) -> None:
    """Given a permit whose Acquire was retried with the same request_key (another process may be
    the one that sends it) When it is released NOT_SENT Then the pace keeps the turn."""
    limiter, store = ops
    t0 = start_ms()
    request = AcquireRequest("steady", "acme", 1, 0, 300_000, "the-same-key")
    first = store.execute(limiter.acquire(request, t0))
    again = store.execute(limiter.acquire(request, t0 + 5))
    assert isinstance(first, Grant) and again == first
    store.execute(limiter.release(first.permit_id, Outcome.NOT_SENT, 0, 0))
    assert ask(ops, "steady", t0 + 10) == Denial(DenyReason.RPM, 90)


def test_window_pacing_and_local_pools_keep_the_window_alone(ops: tuple[LimiterOps, RedisStore]) -> None:
    """A pool with pacing = "window" (and a local pool, by default) may spend its window at once."""
    t0 = start_ms()
    for pool in ("windowed", "gpu"):
        replies = [ask(ops, pool, t0) for _ in range(12)]
        assert sum(isinstance(r, Grant) for r in replies) == 10
        assert all(isinstance(r, Denial) and r.reason is DenyReason.RPM for r in replies[10:])
    assert CONFIG.pool("gpu").pacing == "window"
    assert CONFIG.pool("steady").pacing == "gcra"
    assert (CONFIG.pool("race").burst_seconds, CONFIG.pool("gpu").burst_seconds) == (1.0, 0.0)
    assert parse_config("[pools.x]\nrpm = 1\ntpm = 1\nmax_in_flight = 1\n").pool("x").burst_seconds == 0.5


def test_the_window_still_caps_the_minute_under_a_burst(ops: tuple[LimiterOps, RedisStore]) -> None:
    """GCRA with a burst could let RPM + burst through in a minute; the window keeps it at RPM."""
    t0 = start_ms()
    granted = sum(isinstance(ask(ops, "race", t0 + s * 50), Grant) for s in range(1200))
    assert granted == 600


def test_concurrent_acquires_never_spend_the_same_turn(ops: tuple[LimiterOps, RedisStore]) -> None:
    """Given 16 threads, each with its own Redis connection, released together
    When each asks 25 times at the same instant of the script's clock
    Then exactly the burst (one second's worth: 10) is granted, and the pace moved 10 intervals."""
    limiter, _ = ops
    t0 = start_ms()
    barrier = threading.Barrier(16)
    grants: list[str] = []
    lock = threading.Lock()

    def racer() -> None:
        store = RedisStore(redis.Redis.from_url(SHARED_REDIS_URL))
        try:
            barrier.wait()
            for _ in range(25):
                reply = ask((limiter, store), "race", t0)
                if isinstance(reply, Grant):
                    with lock:
                        grants.append(reply.permit_id)
        finally:
            store.close()

    threads = [threading.Thread(target=racer) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(grants) == len(set(grants)) == 10
    client = redis.Redis.from_url(SHARED_REDIS_URL)
    try:
        assert float(client.hget(limiter.keys.pace("race"), "r") or 0) == t0 + 1_000
    finally:
        client.close()


def test_concurrent_acquires_on_redis_time_keep_the_pace(ops: tuple[LimiterOps, RedisStore]) -> None:
    """The same race on Redis's own clock: no two grants closer than the interval allows."""
    limiter, _ = ops
    barrier = threading.Barrier(8)
    stamps: list[int] = []
    lock = threading.Lock()

    def racer() -> None:
        store = RedisStore(redis.Redis.from_url(SHARED_REDIS_URL))
        try:
            barrier.wait()
            for _ in range(40):
                reply = ask((limiter, store), "steady", None)
                if isinstance(reply, Grant):
                    with lock:
                        stamps.append(reply.lease_expires_at_ms)
        finally:
            store.close()

    threads = [threading.Thread(target=racer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stamps.sort()
    assert stamps, "the first ask of an idle pool is always granted"
    assert all(b - a >= 100 for a, b in itertools.pairwise(stamps))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('pacing = "steady"', "pacing must be 'gcra' or 'window'"),
        ("burst_seconds = 2", "burst_seconds must be a number from 0 to 1"),
        ("burst_seconds = -0.1", "burst_seconds must be a number from 0 to 1"),
        ('burst_seconds = "1"', "burst_seconds must be a number from 0 to 1"),
        ('pacing = "window"\nburst_seconds = 0.5', "burst_seconds needs pacing = 'gcra'"),
    ],
)
def test_bad_pacing_settings_are_refused(extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(f"[pools.x]\nrpm = 1\ntpm = 1\nmax_in_flight = 1\n{extra}\n")
