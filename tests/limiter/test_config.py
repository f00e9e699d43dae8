"""Pool configuration: the TOML file an operator edits, parsed strictly, reloaded safely."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.limiter.config import (
    ConfigError,
    ConfigHolder,
    PoolLimits,
    TenantPolicy,
    load_config,
    parse_config,
)
from services.limiter.errors import UnknownPool
from services.limiter.settings import DEFAULT_CONFIG, LimiterSettings

VALID = """
[pools.gpt]
rpm = 600
tpm = 2_000_000
max_in_flight = 16

[tenant_defaults]
max_in_flight = 8

[tenants."acme-1"]
max_in_flight = 2
daily_token_budget = 1_000
"""


def test_the_shipped_local_config_has_the_sandbox_pool() -> None:
    """Given deploy/local/limiter.toml (the default FATURA_LIMITER_CONFIG)
    Then it parses and defines the `sandbox` pool the inference worker uses."""
    assert LimiterSettings.from_env({}).config_path == DEFAULT_CONFIG
    config = load_config(DEFAULT_CONFIG)
    assert config.pool("sandbox") == PoolLimits(
        "sandbox", rpm=600, tpm=2_000_000, max_in_flight=16, window_ms=61_000
    )
    assert config.tenant("any-tenant").max_in_flight == 8


def test_tenant_overrides_replace_the_defaults_and_unknown_pools_are_refused() -> None:
    config = parse_config(VALID)
    assert config.tenant("acme-1") == TenantPolicy(max_in_flight=2, daily_token_budget=1_000)
    assert config.tenant("someone-else") == TenantPolicy(max_in_flight=8, daily_token_budget=None)
    assert config.pool("gpt").window_ms == 60_000
    with pytest.raises(UnknownPool, match="unknown pool 'nope'"):
        config.pool("nope")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[pools.gpt]\nrpm = 1\ntpm = 1\n", "pools.gpt.max_in_flight is required"),
        ("[pools.gpt]\nrpm = 0\ntpm = 1\nmax_in_flight = 1\n", r"pools.gpt.rpm=0 is outside"),
        ("[pools.gpt]\nrpm = 1\ntpm = 1\nmax_in_flight = 1\nburst = 3\n", r"unknown key\(s\) \['burst'\]"),
        ('[pools.gpt]\nrpm = "many"\ntpm = 1\nmax_in_flight = 1\n', "must be an integer"),
        ('[pools."a{b}"]\nrpm = 1\ntpm = 1\nmax_in_flight = 1\n', "pool names must match"),
        ("[tenant_defaults]\nmax_in_flight = 1\n", "at least one pool"),
        ("[pools.gpt\n", "not valid TOML"),
    ],
)
def test_a_bad_config_is_refused_with_the_key_named(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(text, "limiter.toml")


def test_a_reload_with_a_broken_file_keeps_the_previous_config(tmp_path: Path) -> None:
    """Given a running config
    When the file is replaced by a broken one and reloaded (SIGHUP)
    Then the previous config stays in force; a later good file is picked up."""
    path = tmp_path / "limiter.toml"
    path.write_text(VALID)
    holder = ConfigHolder(path)
    path.write_text("[pools.gpt\n")
    assert holder.reload() is False
    assert holder.current.pool("gpt").rpm == 600
    path.write_text(VALID.replace("rpm = 600", "rpm = 60"))
    assert holder.reload() is True
    assert holder.current.pool("gpt").rpm == 60


def test_settings_fail_fast_naming_the_variable_and_resolve_the_config_path() -> None:
    from services.common.settings import SettingsError

    settings = LimiterSettings.from_env(
        {"FATURA_LIMITER_CONFIG": "deploy/local/limiter.toml", "FATURA_LIMITER_PORT": "6000"}
    )
    assert settings.config_path == DEFAULT_CONFIG  # relative to the repository root
    assert settings.address == "127.0.0.1:6000"
    assert settings.deadline_ms == 250 and settings.emergency_share == 0.0
    for env, name in [
        ({"FATURA_LIMITER_EMERGENCY_SHARE": "1.5"}, "FATURA_LIMITER_EMERGENCY_SHARE"),
        ({"FATURA_LIMITER_DEADLINE_MS": "soon"}, "FATURA_LIMITER_DEADLINE_MS"),
        ({"FATURA_LIMITER_KEY_PREFIX": "a{b}"}, "FATURA_LIMITER_KEY_PREFIX"),
        (
            {"FATURA_LIMITER_MAX_LEASE_MS": "1000", "FATURA_LIMITER_DEFAULT_LEASE_MS": "5000"},
            "DEFAULT_LEASE_MS",
        ),
    ]:
        with pytest.raises(SettingsError, match=name):
            LimiterSettings.from_env(env)
