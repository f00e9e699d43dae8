"""A local pool's admission unit is in-flight context tokens (prompt + max output: the KV cache a
request holds), checked in the same script as every other dimension. Runs the operations on the
real Redis (db 14), the last test through the limiter server and its client."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from grpc_health.v1 import health_pb2

from services.limiter.config import ConfigError, parse_config
from services.limiter.errors import NeverAdmittable
from services.limiter.model import AcquireRequest, Denial, DenyReason, Grant, Outcome
from services.limiter.operations import KeyLayout, LimiterOps, ServerLimits
from services.limiter.store import RedisStore
from tests.limiter.conftest import SHARED_REDIS_URL, delete_prefix, spawn_limiter

CONFIG_TEXT = """
[pools.gpu]
kind = "local"
rpm = 100000
tpm = 100000000
max_in_flight = 64
kv_blocks = 1000
block_size = 16

[pools.hosted]
pacing = "window"
rpm = 100000
tpm = 100000000
max_in_flight = 2
"""
CONFIG = parse_config(CONFIG_TEXT)


@pytest.fixture
def ops() -> Iterator[tuple[LimiterOps, RedisStore]]:
    prefix = f"kvtest-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(SHARED_REDIS_URL)
    store = RedisStore(client)
    yield LimiterOps(lambda: CONFIG, ServerLimits(max_tokens=1_000_000), KeyLayout(prefix)), store
    store.close()
    delete_prefix(SHARED_REDIS_URL, prefix)


def ask(pool: str, prompt: int, output: int, key: str, lease_ms: int = 0) -> AcquireRequest:
    return AcquireRequest(pool, "acme", prompt, output, lease_ms, key)


def test_a_local_pool_needs_a_kv_capacity_and_a_hosted_pool_refuses_one() -> None:
    assert CONFIG.pool("gpu").kv_token_capacity == 16_000
    assert CONFIG.pool("hosted").kv_token_capacity is None
    with pytest.raises(ConfigError, match="kv_token_capacity or kv_blocks"):
        parse_config('[pools.x]\nkind = "local"\nrpm = 1\ntpm = 1\nmax_in_flight = 1\n')
    with pytest.raises(ConfigError, match="need kind = 'local'"):
        parse_config("[pools.x]\nrpm = 1\ntpm = 1\nmax_in_flight = 1\nkv_token_capacity = 5\n")
    with pytest.raises(ConfigError, match="kv_blocks needs block_size"):
        parse_config('[pools.x]\nkind = "local"\nrpm = 1\ntpm = 1\nmax_in_flight = 1\nkv_blocks = 5\n')
    budget = parse_config(
        '[pools.x]\nkind = "local"\nrpm = 1\ntpm = 1\nmax_in_flight = 1\nkv_token_capacity = 5\n'
    )
    assert budget.pool("x").kv_token_capacity == 5


def test_a_long_document_costs_more_than_a_short_one(ops: tuple[LimiterOps, RedisStore]) -> None:
    """Given 16,000 KV tokens, when a 12,000-token document is in flight, then a 4,000-token one
    still fits, a second long one is denied for KV_TOKENS, and releasing the first admits it."""
    limiter, store = ops
    long_one = store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "long-1")))
    assert isinstance(long_one, Grant)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 3_000, 1_000, "short-1"))), Grant)
    denied = store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "long-2")))
    assert isinstance(denied, Denial)
    assert denied.reason is DenyReason.KV_TOKENS
    assert denied.retry_after_ms >= 1
    store.execute(limiter.release(long_one.permit_id, Outcome.COMPLETED, 11_000, 700))
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "long-2"))), Grant)


def test_a_reservation_is_rounded_up_to_whole_blocks(ops: tuple[LimiterOps, RedisStore]) -> None:
    """999 blocks of 16 tokens taken by one request of 15,984 tokens; one more token is a block."""
    limiter, store = ops
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 15_000, 984, "a"))), Grant)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 15, 1, "b"))), Grant)  # the last block
    denied = store.execute(limiter.acquire(ask("gpu", 1, 0, "c")))
    assert isinstance(denied, Denial) and denied.reason is DenyReason.KV_TOKENS


def test_an_expired_lease_gives_its_kv_tokens_back(ops: tuple[LimiterOps, RedisStore]) -> None:
    limiter, store = ops
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 15_000, 1_000, "dead", lease_ms=200))), Grant)
    denied = store.execute(limiter.acquire(ask("gpu", 1_000, 0, "next")))
    assert isinstance(denied, Denial) and denied.reason is DenyReason.KV_TOKENS
    assert denied.retry_after_ms <= 200
    time.sleep(0.25)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 1_000, 0, "next-2"))), Grant)


def test_a_request_bigger_than_the_kv_cache_is_never_admittable(ops: tuple[LimiterOps, RedisStore]) -> None:
    limiter, _ = ops
    with pytest.raises(NeverAdmittable, match="can never fit local pool 'gpu'"):
        limiter.acquire(ask("gpu", 80_000, 2_000, "huge"))


def test_a_denied_dimension_takes_no_kv_tokens(ops: tuple[LimiterOps, RedisStore]) -> None:
    """All or nothing: a request denied by the tenant or in-flight cap holds no KV either."""
    limiter, store = ops
    keys = limiter.keys
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 100, 100, "one"))), Grant)
    client = redis.Redis.from_url(SHARED_REDIS_URL)
    assert client.hlen(keys.kv_held("gpu")) == 1
    store.execute(limiter.report_throttle("gpu", 5_000))
    denied = store.execute(limiter.acquire(ask("gpu", 100, 100, "two")))
    assert isinstance(denied, Denial) and denied.reason is DenyReason.COOLDOWN
    assert client.hlen(keys.kv_held("gpu")) == 1


def test_a_hosted_pool_still_counts_requests_not_tokens(ops: tuple[LimiterOps, RedisStore]) -> None:
    limiter, store = ops
    assert isinstance(store.execute(limiter.acquire(ask("hosted", 90_000, 1_000, "h1"))), Grant)
    assert isinstance(store.execute(limiter.acquire(ask("hosted", 90_000, 1_000, "h2"))), Grant)
    denied = store.execute(limiter.acquire(ask("hosted", 10, 10, "h3")))
    assert isinstance(denied, Denial) and denied.reason is DenyReason.IN_FLIGHT


def test_the_first_request_turned_away_heads_the_line_so_short_ones_cannot_starve_it(
    ops: tuple[LimiterOps, RedisStore],
) -> None:
    """Given a cache half taken, when a long document is denied for KV tokens, then a short one
    that would fit the gap is denied too; once KV frees, the long one is granted first."""
    limiter, store = ops
    first = store.execute(limiter.acquire(ask("gpu", 7_000, 1_000, "running")))
    assert isinstance(first, Grant)
    long_denied = store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "long")))
    assert isinstance(long_denied, Denial) and long_denied.reason is DenyReason.KV_TOKENS
    short_denied = store.execute(limiter.acquire(ask("gpu", 1_000, 500, "short")))
    assert isinstance(short_denied, Denial) and short_denied.reason is DenyReason.KV_TOKENS
    store.execute(limiter.release(first.permit_id, Outcome.COMPLETED, 7_000, 300))
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "long"))), Grant)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 1_000, 500, "short"))), Grant)


def test_the_line_is_first_come_first_served_not_whoever_asks_first_after_a_grant(
    ops: tuple[LimiterOps, RedisStore],
) -> None:
    """Given long requests A, B and C turned away in that order, when A has been granted and the
    cache frees again, then B is granted before C even though C asked first: the next oldest
    heads the line."""
    limiter, store = ops
    running = store.execute(limiter.acquire(ask("gpu", 7_000, 1_000, "running")))
    assert isinstance(running, Grant)
    for key in ("a", "b", "c"):
        denied = store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, key)))
        assert isinstance(denied, Denial) and denied.reason is DenyReason.KV_TOKENS
    store.execute(limiter.release(running.permit_id, Outcome.COMPLETED, 7_000, 300))
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "b"))), Denial)
    a = store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "a")))
    assert isinstance(a, Grant)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "c"))), Denial)
    store.execute(limiter.release(a.permit_id, Outcome.COMPLETED, 11_000, 300))
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "c"))), Denial)
    assert isinstance(store.execute(limiter.acquire(ask("gpu", 11_000, 1_000, "b"))), Grant)


def test_a_head_of_the_line_that_stops_asking_loses_its_place(ops: tuple[LimiterOps, RedisStore]) -> None:
    limiter, store = ops
    short_hold = LimiterOps(
        lambda: CONFIG, ServerLimits(max_tokens=1_000_000, kv_head_hold_ms=200), limiter.keys
    )
    assert isinstance(store.execute(short_hold.acquire(ask("gpu", 7_000, 1_000, "running"))), Grant)
    denied = store.execute(short_hold.acquire(ask("gpu", 11_000, 1_000, "gone")))
    assert isinstance(denied, Denial)
    assert isinstance(store.execute(short_hold.acquire(ask("gpu", 1_000, 500, "short"))), Denial)
    time.sleep(0.25)
    assert isinstance(store.execute(short_hold.acquire(ask("gpu", 1_000, 500, "short"))), Grant)


def test_over_grpc_a_request_bigger_than_the_cache_is_never_admittable_and_a_retry_keeps_its_place(
    tmp_path: Path,
) -> None:
    """Through the server and the client the workers use: a request bigger than the local pool's
    whole cache raises the client's NeverAdmittable (not a plain InvalidArgument); a long request
    denied for KV tokens asks again with its request_key, is granted before a short one that came
    later, and asking once more returns the same permit instead of a second one."""
    limiter = spawn_limiter(CONFIG_TEXT, tmp_path)
    try:
        limiter.wait_health(health_pb2.HealthCheckResponse.SERVING)
        with limiter.client() as client:
            with pytest.raises(NeverAdmittable, match="can never fit local pool 'gpu'"):
                client.acquire("gpu", "acme", 20_000, 1_000, request_key="huge")
            running = client.acquire("gpu", "acme", 7_000, 1_000, lease_ms=30_000, request_key="running")
            assert isinstance(running, Grant)
            long_denied = client.acquire("gpu", "acme", 11_000, 1_000, lease_ms=30_000, request_key="long")
            assert isinstance(long_denied, Denial) and long_denied.reason is DenyReason.KV_TOKENS
            short_denied = client.acquire("gpu", "acme", 1_000, 500, request_key="short")
            assert isinstance(short_denied, Denial) and short_denied.reason is DenyReason.KV_TOKENS
            client.release(running.permit_id, Outcome.COMPLETED, 7_000, 300)
            first = client.acquire("gpu", "acme", 11_000, 1_000, lease_ms=30_000, request_key="long")
            again = client.acquire("gpu", "acme", 11_000, 1_000, lease_ms=30_000, request_key="long")
            assert isinstance(first, Grant) and again == first
            assert client.pool_status("gpu").in_flight.used == 1
            client.release(first.permit_id, Outcome.COMPLETED, 11_000, 400)
    finally:
        limiter.stop()
