"""The inference worker's self-wake timer: a worker turned away by a paced pool wakes itself once the
pool reopens, also when a later denial moved the reopening past the timer already set."""

from __future__ import annotations

import threading
import time

from services.inference.executor import Executor


def _timers_only() -> tuple[Executor, list[float]]:
    """An executor with just its timer state; its wake() records when it was called."""
    executor = Executor.__new__(Executor)
    executor._stopping = threading.Event()
    executor._rewake_lock = threading.Lock()
    executor._rewake = None
    executor._rewake_at = 0.0
    executor._pool_closed_until = 0.0
    woken: list[float] = []

    def wake() -> bool:
        woken.append(time.monotonic())
        return True

    executor.wake = wake  # type: ignore[method-assign]
    return executor, woken


def test_a_worker_wakes_once_the_pool_reopens_even_when_a_later_denial_moved_the_reopening() -> None:
    executor, woken = _timers_only()
    # Given a claim turned away until 0.05 s from now: a timer is set for then
    executor._pool_closed_until = time.monotonic() + 0.05
    executor._wake_when_open(0.05)
    # And another claim turned away a moment later, until 0.3 s from now (its timer is left to the
    # one already set, which comes first)
    reopens = time.monotonic() + 0.3
    executor._pool_closed_until = reopens
    executor._wake_when_open(0.3)
    # When the first timer fires, the pool is still closed; then it reopens
    deadline = time.monotonic() + 3
    while not woken and time.monotonic() < deadline:
        time.sleep(0.01)
    # Then the worker woke, and not before the pool reopened (a wake-up then would have been
    # dropped as "pool closed", with no timer left to wake it again)
    assert woken, "the worker never woke"
    assert woken[0] >= reopens
