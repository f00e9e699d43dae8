"""The supervisor's restart policy: exponential, capped, jittered, and reset by a long life."""

from __future__ import annotations

import random

import pytest

from services.cli.stack import RestartPolicy, describe_exit
from services.common.settings import SettingsError


def test_the_delay_doubles_with_each_quick_exit_until_the_cap() -> None:
    policy = RestartPolicy(base_seconds=1.0, cap_seconds=8.0, reset_after_seconds=60.0)
    rng = random.Random(7)
    ceilings = [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    for exits, ceiling in enumerate(ceilings, start=1):
        delays = [policy.delay(exits, rng) for _ in range(200)]
        # jitter over the upper half: never at once, never past the ceiling
        assert min(delays) >= ceiling / 2
        assert max(delays) <= ceiling
        assert max(delays) - min(delays) > ceiling / 10


def test_a_child_that_stayed_up_long_enough_starts_the_count_again() -> None:
    policy = RestartPolicy(base_seconds=1.0, cap_seconds=30.0, reset_after_seconds=10.0)
    exits = 0
    for uptime in (0.5, 0.5, 0.5):
        exits = policy.quick_exits(exits, uptime)
    assert exits == 3
    assert policy.quick_exits(exits, 10.0) == 1
    assert policy.quick_exits(exits, 9.9) == 4


def test_a_huge_exit_count_does_not_overflow_the_delay() -> None:
    policy = RestartPolicy(base_seconds=0.5, cap_seconds=30.0)
    assert 15.0 <= policy.delay(10_000, random.Random(1)) <= 30.0


def test_the_policy_comes_from_fatura_variables() -> None:
    policy = RestartPolicy.from_env(
        {
            "FATURA_RESTART_BASE_SECONDS": "0.2",
            "FATURA_RESTART_CAP_SECONDS": "5",
            "FATURA_RESTART_RESET_SECONDS": "12",
        }
    )
    assert policy == RestartPolicy(0.2, 5.0, 12.0)
    assert RestartPolicy.from_env({}) == RestartPolicy()


@pytest.mark.parametrize(
    "env",
    [
        {"FATURA_RESTART_BASE_SECONDS": "soon"},
        {"FATURA_RESTART_BASE_SECONDS": "0"},
        {"FATURA_RESTART_BASE_SECONDS": "10", "FATURA_RESTART_CAP_SECONDS": "5"},
        {"FATURA_RESTART_RESET_SECONDS": "-1"},
    ],
)
def test_a_bad_restart_setting_fails_fast_naming_the_variable(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="FATURA_RESTART_"):
        RestartPolicy.from_env(env)


def test_an_exit_by_signal_is_named() -> None:
    assert describe_exit(-9) == "-9 (SIGKILL)"
    assert describe_exit(1) == "1"
