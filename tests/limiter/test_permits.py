"""Permits through the real limiter process and real Redis: every dimension, leases, refunds."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest

from services.common.protos.fatura.limiter.v1 import limiter_pb2 as pb
from services.common.protos.fatura.limiter.v1 import limiter_pb2_grpc as pb_grpc
from services.limiter.errors import InvalidArgument, PermitNotFound, PermitNotHeld, RequestKeyConflict
from services.limiter.model import Denial, DenyReason, Grant, Outcome, PoolStatus

if TYPE_CHECKING:
    from tests.limiter.conftest import LimiterProcess

WORKER = Path(__file__).with_name("limiter_worker.py")
LEASE_MS = 30_000


def usage(status: PoolStatus) -> tuple[int, int, int]:
    return status.requests.used, status.tokens.used, status.in_flight.used


def granted(result: Grant | Denial) -> Grant:
    assert isinstance(result, Grant), result
    return result


def test_a_retried_acquire_returns_the_same_permit_and_takes_one_slot(shared_limiter: LimiterProcess) -> None:
    """Given an Acquire whose answer the caller did not see
    When the caller retries with the same request_key
    Then it gets the same permit, and the pool counts one request and one slot."""
    with shared_limiter.client() as client:
        first = granted(client.acquire("basic", "acme", 100, 50, lease_ms=LEASE_MS, request_key="retry-me"))
        again = granted(client.acquire("basic", "acme", 100, 50, lease_ms=LEASE_MS, request_key="retry-me"))
        assert again == first
        assert usage(client.pool_status("basic")) == (1, 150, 1)
        with pytest.raises(RequestKeyConflict):
            client.acquire("basic", "acme", 999, 50, request_key="retry-me")
        assert client.release(first.permit_id, Outcome.COMPLETED, 80, 20) is True
        assert client.release(first.permit_id, Outcome.COMPLETED, 80, 20) is False  # idempotent
        assert client.release(first.permit_id, Outcome.NOT_SENT) is False  # the first release won
        assert usage(client.pool_status("basic")) == (1, 100, 0)
        with pytest.raises(PermitNotHeld, match="already released"):
            client.acquire("basic", "acme", 100, 50, request_key="retry-me")


def test_a_denied_acquire_changes_no_dimension(shared_limiter: LimiterProcess) -> None:
    """Given a pool whose only in-flight slot is held (its RPM and TPM have room)
    When another Acquire is denied for IN_FLIGHT
    Then its request and tokens were not taken either: all or nothing."""
    with shared_limiter.client() as client:
        holder = granted(client.acquire("atomic", "acme", 100, 100, lease_ms=LEASE_MS))
        before = client.pool_status("atomic")
        denied = client.acquire("atomic", "acme", 100, 100)
        assert isinstance(denied, Denial) and denied.reason is DenyReason.IN_FLIGHT
        assert 0 < denied.retry_after_ms <= 1_000
        assert usage(client.pool_status("atomic")) == usage(before) == (1, 200, 1)
        client.release(holder.permit_id, Outcome.COMPLETED, 10, 10)


def test_bad_input_is_refused_with_a_message_and_changes_nothing(shared_limiter: LimiterProcess) -> None:
    """Negative or absurd token counts, an empty or unknown pool, a lease over the maximum and an
    unknown permit each get INVALID_ARGUMENT or NOT_FOUND with a message; the pool is unchanged."""
    with grpc.insecure_channel(shared_limiter.address) as channel, shared_limiter.client() as client:
        stub = pb_grpc.LimiterServiceStub(channel)
        before = usage(client.pool_status("basic"))
        good = {"pool": "basic", "tenant": "acme", "estimated_input_tokens": 10, "max_output_tokens": 10}
        cases = [
            ({**good, "estimated_input_tokens": -5}, "must not be negative"),
            ({**good, "max_output_tokens": 10**12}, "over the maximum"),
            ({**good, "pool": ""}, "pool must not be empty"),
            ({**good, "pool": "no-such-pool"}, "unknown pool"),
            ({**good, "lease_ms": 10**8}, "over the maximum lease"),
        ]
        for fields, message in cases:
            with pytest.raises(grpc.RpcError) as raised:
                stub.Acquire(pb.AcquireRequest(request_key="bad", **fields), timeout=5)
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert message in raised.value.details()
        with pytest.raises(grpc.RpcError) as raised:
            stub.Release(
                pb.ReleaseRequest(permit_id="basic/acme/" + "0" * 32, outcome=pb.OUTCOME_COMPLETED), timeout=5
            )
        assert raised.value.code() is grpc.StatusCode.NOT_FOUND and "no permit" in raised.value.details()
        with pytest.raises(grpc.RpcError) as raised:
            stub.Release(pb.ReleaseRequest(permit_id="basic/acme/" + "0" * 32), timeout=5)
        assert (
            raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            and "outcome must be" in raised.value.details()
        )
        with pytest.raises(grpc.RpcError) as raised:
            stub.ReportThrottle(pb.ReportThrottleRequest(pool="basic", retry_after_ms=-1), timeout=5)
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(InvalidArgument, match="malformed permit_id"):
            client.renew("garbage")
        with pytest.raises(PermitNotFound):
            client.renew("basic/acme/" + "1" * 32)
        assert usage(client.pool_status("basic")) == before


def test_rpm_holds_across_window_boundaries(shared_limiter: LimiterProcess) -> None:
    """Given a pool allowing 5 requests per 1 s sliding window
    When a client asks as fast as it can for 2.5 windows, releasing every permit at once
    Then no 1 s span (on the Redis clock) holds more than 5 grants -- where a fixed window would
    let 10 through around its boundary -- and requests keep being granted window after window."""
    grant_times: list[int] = []
    denial_reasons: set[DenyReason] = set()
    with shared_limiter.client() as client:
        stop = time.monotonic() + 2.5
        while time.monotonic() < stop:
            result = client.acquire("rpm", "acme", 1, 1, lease_ms=LEASE_MS)
            if isinstance(result, Grant):
                grant_times.append(result.lease_expires_at_ms - LEASE_MS)  # the Redis time of the grant
                client.release(result.permit_id, Outcome.COMPLETED, 1, 1)
            else:
                denial_reasons.add(result.reason)
                time.sleep(0.01)
    assert denial_reasons == {DenyReason.RPM}
    assert len(grant_times) >= 10, grant_times  # at least two windows' worth went through
    for t in grant_times:
        in_window = [g for g in grant_times if t - 1_000 < g <= t]
        assert len(in_window) <= 5, (t, in_window)


def test_a_killed_holders_slots_come_back_when_its_lease_ends(shared_limiter: LimiterProcess) -> None:
    """Given a client process holding both slots of a pool with 1.5 s leases
    When it is killed with SIGKILL (it never releases)
    Then the pool stays full until the leases expire, and is granted again after that."""
    holder = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "hold",
            shared_limiter.address,
            "kill",
            "--count",
            "2",
            "--lease-ms",
            "1500",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        held = json.loads(holder.stdout.readline())["held"]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    # The holder took its two permits one after the other, so their leases may end a few ms apart;
    # a slot is back when the first of them ends, not before.
    first_lease_end = min(p["lease_expires_at_ms"] for p in held)
    with shared_limiter.client() as client:
        denied = client.acquire("kill", "other", 1, 1)
        assert isinstance(denied, Denial) and denied.reason is DenyReason.IN_FLIGHT
        deadline = time.monotonic() + 15
        result: Grant | Denial = denied
        while not isinstance(result, Grant) and time.monotonic() < deadline:
            time.sleep(0.1)
            result = client.acquire("kill", "other", 1, 1, lease_ms=LEASE_MS)
        grant = granted(result)
        # Not before a dead holder's lease ended.
        assert grant.lease_expires_at_ms - LEASE_MS >= first_lease_end
        with pytest.raises(PermitNotHeld, match="expired"):
            client.renew(held[0]["permit_id"])
        # A late release of an expired permit is still accepted (its tokens are settled).
        assert client.release(held[0]["permit_id"], Outcome.UNKNOWN) is True
        client.release(grant.permit_id, Outcome.COMPLETED, 1, 1)


def test_one_clients_throttle_report_denies_every_client_until_the_cooldown_ends(
    shared_limiter: LimiterProcess,
) -> None:
    """Given three clients (separate channels) of one pool
    When one reports a provider 429 with Retry-After 1.5 s, and later a shorter 0.2 s one
    Then every client is denied COOLDOWN, the shorter report does not shorten the cooldown,
    and Acquire is granted again once it is over."""
    clients = [shared_limiter.client() for _ in range(3)]
    try:
        until = clients[0].report_throttle("cool", 1_500)
        assert clients[1].report_throttle("cool", 200) == until
        assert clients[2].pool_status("cool").cooldown_until_ms == until
        for client in clients:
            denied = client.acquire("cool", "acme", 1, 1)
            assert isinstance(denied, Denial) and denied.reason is DenyReason.COOLDOWN
            assert 0 < denied.retry_after_ms <= 1_500
        time.sleep(denied.retry_after_ms / 1000 + 0.05)
        for client in clients:
            client.release(granted(client.acquire("cool", "acme", 1, 1)).permit_id, Outcome.NOT_SENT)
        assert clients[0].pool_status("cool").cooldown_until_ms is None
    finally:
        for client in clients:
            client.close()


def test_token_reservations_and_corrections_add_up_after_many_mixed_outcomes(
    shared_limiter: LimiterProcess,
) -> None:
    """Given 300 permits with random reservations, settled COMPLETED (usage below or above the
    reservation), NOT_SENT or UNKNOWN, or still held
    Then the window holds exactly: reported usage for COMPLETED, nothing for NOT_SENT (not even
    the request), the whole reservation for UNKNOWN and for permits still held."""
    rng = random.Random(20261130)
    expected_tokens = expected_requests = expected_held = 0
    with shared_limiter.client() as client:
        held: list[str] = []
        for _ in range(300):
            estimated, max_output = rng.randrange(0, 3_000), rng.randrange(1, 2_000)
            grant = granted(
                client.acquire("tpm", f"t{rng.randrange(3)}", estimated, max_output, lease_ms=LEASE_MS)
            )
            outcome = rng.choice(["COMPLETED", "NOT_SENT", "UNKNOWN", "HELD"])
            if outcome == "HELD":
                held.append(grant.permit_id)
                expected_tokens += estimated + max_output
                expected_requests += 1
                expected_held += 1
            elif outcome == "COMPLETED":
                used_in, used_out = rng.randrange(0, 4_000), rng.randrange(0, 3_000)
                client.release(grant.permit_id, Outcome.COMPLETED, used_in, used_out)
                expected_tokens += used_in + used_out
                expected_requests += 1
            elif outcome == "NOT_SENT":
                client.release(grant.permit_id, Outcome.NOT_SENT, 123, 456)  # usage ignored: never sent
            else:
                client.release(grant.permit_id, Outcome.UNKNOWN, 1, 1)
                expected_tokens += estimated + max_output
                expected_requests += 1
        status = client.pool_status("tpm")
        assert (status.requests.used, status.tokens.used, status.in_flight.used) == (
            expected_requests,
            expected_tokens,
            expected_held,
        )
        assert status.tokens.headroom == status.tokens.limit - expected_tokens
        for permit_id in held:
            client.release(permit_id, Outcome.NOT_SENT)


def test_tenant_caps_and_daily_budgets_apply_within_the_pool(shared_limiter: LimiterProcess) -> None:
    """Given tenant `capped` (1 in flight) and tenant `budgeted` (10,000 tokens a day)
    Then `capped` is denied TENANT_IN_FLIGHT while another tenant is granted, and `budgeted`
    is charged its reservation, corrected to usage on COMPLETED and kept whole on UNKNOWN."""
    with shared_limiter.client() as client:
        first = granted(client.acquire("tenants", "capped", 1, 1, lease_ms=LEASE_MS))
        denied = client.acquire("tenants", "capped", 1, 1)
        assert isinstance(denied, Denial) and denied.reason is DenyReason.TENANT_IN_FLIGHT
        other = granted(client.acquire("tenants", "someone-else", 1, 1))
        for permit in (first, other):
            client.release(permit.permit_id, Outcome.COMPLETED, 1, 1)

        big = granted(client.acquire("tenants", "budgeted", 1_000, 5_000, lease_ms=LEASE_MS))
        over = client.acquire("tenants", "budgeted", 2_000, 2_001)  # 6,000 reserved + 4,001 > 10,000
        assert isinstance(over, Denial) and over.reason is DenyReason.TENANT_BUDGET
        assert 0 < over.retry_after_ms <= 86_400_000  # until the next UTC day
        client.release(big.permit_id, Outcome.COMPLETED, 1_200, 300)  # charged 1,500 now
        rest = granted(client.acquire("tenants", "budgeted", 4_000, 4_500))  # 1,500 + 8,500 = 10,000
        client.release(rest.permit_id, Outcome.UNKNOWN)  # sent, no answer: all 8,500 kept
        exhausted = client.acquire("tenants", "budgeted", 1, 0)
        assert isinstance(exhausted, Denial) and exhausted.reason is DenyReason.TENANT_BUDGET


def test_renew_extends_a_held_lease_and_refuses_a_released_one(shared_limiter: LimiterProcess) -> None:
    with shared_limiter.client() as client:
        grant = granted(client.acquire("basic", "acme", 1, 1, lease_ms=1_000))
        renewed = client.renew(grant.permit_id, lease_ms=LEASE_MS)
        assert renewed > grant.lease_expires_at_ms
        client.release(grant.permit_id, Outcome.COMPLETED, 1, 1)
        with pytest.raises(PermitNotHeld, match="released"):
            client.renew(grant.permit_id)
