"""The pure figures of the benchmarks: seed 000's capacity formula and the percentile every bench reports."""

from __future__ import annotations

import math

import pytest

from bench import cpu
from bench import delivery as delivery_bench
from bench.quota import Samples, capacity, windows
from bench.report import percentile


def test_capacity_formula_reproduces_the_seeds_worked_example() -> None:
    # Given the seed's example: 600 RPM, a TPM budget of 600,000 with 6,000 tokens reserved per
    # call, and 20 concurrent calls of 10 s each
    # When the formula is applied
    figures = capacity(rpm=600, tpm=600_000, reserved_tokens=6000, concurrency=20, mean_seconds=10)
    # Then each term and the minimum are the seed's: min(10, 1.6667, 2) = 1.6667 attempts/s
    assert figures["rpm_term"] == pytest.approx(10)
    assert figures["tpm_term"] == pytest.approx(1.6667, abs=1e-4)
    assert figures["concurrency_term"] == pytest.approx(2)
    assert figures["capacity"] == pytest.approx(1.6667, abs=1e-4)


def test_quota_windows_are_whole_5_s_spans_after_the_warm_up() -> None:
    # Given samples every 0.5 s of a counter that admits 10/s for 12 s, then nothing
    at = [i / 2 for i in range(45)]
    samples = Samples(at=at, admitted=[round(10 * min(t, 12.0)) for t in at])
    # When cut into 5 s windows after a 2 s warm-up
    rates = windows(samples, 2.0)
    # Then 10/s in the windows before 12 s, nothing after, and none the samples do not cover
    assert rates == [(2.0, 10.0), (7.0, 10.0), (12.0, 0.0), (17.0, 0.0)]


def test_an_unlimited_dimension_never_binds() -> None:
    figures = capacity(rpm=600, tpm=0, reserved_tokens=4913, concurrency=20, mean_seconds=1.0)
    assert math.isinf(figures["tpm_term"])
    assert figures["capacity"] == pytest.approx(10)


def test_busy_cpu_leaves_out_idle_iowait_steal_and_the_guest_time_user_already_holds() -> None:
    # Given a /proc/stat cpu line: user 100, nice 10, system 50, idle 1000, iowait 20, irq 3,
    # softirq 7, steal 40, guest 30 (inside user), guest_nice 0
    line = "cpu  100 10 50 1000 20 3 7 40 30 0"
    # When read
    busy, steal = cpu.busy_and_steal(line)
    # Then busy is user + nice + system + irq + softirq, and steal is apart
    tick = cpu._TICK
    assert busy == pytest.approx(170 / tick)
    assert steal == pytest.approx(40 / tick)


def test_p95_of_twenty_tries_is_the_nineteenth_slowest() -> None:
    tries = [float(i) for i in range(1, 21)]
    assert percentile(tries, 0.95) == 19.0
    assert percentile(tries, 0.50) == 10.0


def test_percentile_is_the_nearest_rank_whatever_the_order_and_nan_for_nothing() -> None:
    calls = [float(i) for i in range(3000, 0, -1)]
    assert percentile(calls, 0.99) == 2970.0
    assert percentile(calls, 1.0) == 3000.0
    assert percentile(calls, 0.0) == 1.0
    assert math.isnan(percentile([], 0.5))


def test_the_delivery_bench_gives_each_process_its_cpu_per_item_largest_first() -> None:
    ms = delivery_bench._per_item({"delivery-worker": 3.0, "erp": 1.5, "redis": 0.0, "postgres": 0.5}, 2000)
    assert ms == {"delivery-worker": 1.5, "erp": 0.75, "postgres": 0.25}  # idle processes left out
    assert delivery_bench._listed(ms) == "2.50 in all (delivery-worker 1.50, erp 0.75, postgres 0.25)"
    assert delivery_bench._listed({}) == "not measured"


def test_the_threaded_open_loop_keeps_each_calls_scheduled_start_and_never_more_in_flight_than_threads() -> (
    None
):
    import threading
    import time

    from bench import load

    lock, in_flight, most = threading.Lock(), [0], [0]
    seen: list[float] = []

    def call(scheduled: float) -> float:
        with lock:
            in_flight[0] += 1
            most[0] = max(most[0], in_flight[0])
            seen.append(scheduled)
            nth = len(seen)
        if nth % 7 == 0:
            time.sleep(0.02)  # slower than threads / rate: its thread's next start is late
        with lock:
            in_flight[0] -= 1
        if nth % 10 == 0:
            raise TimeoutError("refused")
        return scheduled

    first = time.monotonic()
    calls = load.threaded_open_loop(400, 0.25, 3, call, failures=(TimeoutError,), start_at=first)
    schedule = [first + i / 400 for i in range(100)]
    assert sorted(seen) == schedule  # every scheduled call ran once, handed its own schedule
    assert list(calls.values) == list(calls.starts)  # the start kept is the scheduled one
    assert len(calls.starts) + len(calls.failures) == 100 and calls.failures
    assert all(end >= start for start, end in zip(calls.starts, calls.ends, strict=True))
    assert most[0] <= 3
