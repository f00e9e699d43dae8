"""The client's local emergency quota: bounded, closed by default, honouring throttles."""

from __future__ import annotations

from services.limiter.config import parse_config
from services.limiter.emergency import EmergencyLimits, EmergencyQuota, is_emergency
from services.limiter.model import Denial, DenyReason, Grant, Outcome

CONFIG = parse_config("[pools.p]\nrpm = 40\ntpm = 4000\nmax_in_flight = 8\nwindow_ms = 1000\n")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def test_share_zero_means_closed() -> None:
    quota = EmergencyQuota.from_config(CONFIG, 0.0)
    assert quota.try_acquire("p", 10, 1_000) == Denial(DenyReason.UNAVAILABLE, 1_000)


def test_a_process_takes_at_most_its_share_of_in_flight_slots() -> None:
    """Given share 0.25 of a pool with 8 in-flight slots
    Then this process gets 2 emergency permits and the third is denied until one is released."""
    clock = Clock()
    quota = EmergencyQuota.from_config(CONFIG, 0.25, clock=clock)
    first, second = quota.try_acquire("p", 10, 5_000), quota.try_acquire("p", 10, 5_000)
    assert isinstance(first, Grant) and isinstance(second, Grant)
    assert first.emergency and is_emergency(first.permit_id)
    third = quota.try_acquire("p", 10, 5_000)
    assert isinstance(third, Denial) and third.reason is DenyReason.UNAVAILABLE
    assert quota.release(first.permit_id, Outcome.COMPLETED, 20) is True
    assert quota.release(first.permit_id, Outcome.COMPLETED, 20) is False  # already settled
    assert isinstance(quota.try_acquire("p", 10, 5_000), Grant)


def test_expired_local_leases_free_their_slots() -> None:
    clock = Clock()
    quota = EmergencyQuota.from_config(CONFIG, 0.125, clock=clock)  # 1 slot, 5 requests per window
    assert isinstance(quota.try_acquire("p", 10, 100), Grant)
    assert isinstance(quota.try_acquire("p", 10, 100), Denial)
    clock.now += 100
    assert isinstance(quota.try_acquire("p", 10, 100), Grant)


def test_requests_and_tokens_per_window_are_bounded_and_refunds_follow_the_outcome() -> None:
    """Given share 0.25: 10 requests and 1000 tokens per 1 s window, 2 slots
    Then tokens beyond the share are denied until the window moves, and NOT_SENT refunds."""
    clock = Clock()
    quota = EmergencyQuota(
        {
            "p": EmergencyLimits(
                max_in_flight=2, requests_per_window=10, tokens_per_window=1_000, window_ms=1_000
            )
        },
        clock=clock,
    )
    big = quota.try_acquire("p", 900, 10_000)
    assert isinstance(big, Grant)
    denied = quota.try_acquire("p", 200, 10_000)
    assert isinstance(denied, Denial) and denied.retry_after_ms == 1_000
    quota.release(big.permit_id, Outcome.NOT_SENT, 0)  # never sent: its 900 tokens come back
    assert isinstance(quota.try_acquire("p", 200, 10_000), Grant)
    clock.now += 1_000
    assert isinstance(quota.try_acquire("p", 900, 10_000), Grant)


def test_a_throttle_pauses_emergency_permits_too() -> None:
    clock = Clock()
    quota = EmergencyQuota.from_config(CONFIG, 0.5, clock=clock)
    quota.note_throttle("p", 700)
    denied = quota.try_acquire("p", 10, 1_000)
    assert isinstance(denied, Denial) and denied.retry_after_ms == 700
    clock.now += 700
    assert isinstance(quota.try_acquire("p", 10, 1_000), Grant)


def test_unknown_pools_get_no_emergency_permits() -> None:
    quota = EmergencyQuota.from_config(CONFIG, 1.0)
    assert isinstance(quota.try_acquire("other", 10, 1_000), Denial)
