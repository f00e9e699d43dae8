"""Who may reach the JobService: API keys never cross a network in clear by accident."""

from __future__ import annotations

import pytest

from services.acceptance.jobs_grpc.settings import JobsGrpcSettings
from services.common.settings import SettingsError


def test_defaults_listen_on_loopback_at_50051_with_reflection() -> None:
    settings = JobsGrpcSettings.from_env({})
    assert (settings.host, settings.port, settings.metrics_port, settings.reflection) == (
        "127.0.0.1",
        50051,
        9187,
        True,
    )
    settings.check_listener()


@pytest.mark.parametrize(
    ("env", "allowed"),
    [
        ({"FATURA_JOBS_GRPC_HOST": "0.0.0.0"}, False),
        ({"FATURA_JOBS_GRPC_HOST": "jobs.internal"}, False),
        ({"FATURA_JOBS_GRPC_HOST": "::1"}, True),
        ({"FATURA_JOBS_GRPC_HOST": "0.0.0.0", "FATURA_JOBS_GRPC_ALLOW_PLAINTEXT": "1"}, True),
        (
            {
                "FATURA_JOBS_GRPC_HOST": "0.0.0.0",
                "FATURA_JOBS_GRPC_TLS_CERT": "/etc/fatura/tls.crt",
                "FATURA_JOBS_GRPC_TLS_KEY": "/etc/fatura/tls.key",
            },
            True,
        ),
    ],
)
def test_beyond_loopback_it_listens_only_with_tls_or_a_declared_proxy(
    env: dict[str, str], allowed: bool
) -> None:
    settings = JobsGrpcSettings.from_env(env)
    if allowed:
        settings.check_listener()
    else:
        with pytest.raises(SettingsError, match="FATURA_JOBS_GRPC_TLS_CERT"):
            settings.check_listener()


@pytest.mark.parametrize(
    "env",
    [
        {"FATURA_JOBS_GRPC_TLS_CERT": "/etc/fatura/tls.crt"},
        {"FATURA_JOBS_GRPC_REFLECTION": "maybe"},
        {"FATURA_JOBS_GRPC_PORT": "70000"},
    ],
)
def test_a_bad_setting_is_refused_with_its_name(env: dict[str, str]) -> None:
    with pytest.raises(SettingsError, match="FATURA_JOBS_GRPC_"):
        JobsGrpcSettings.from_env(env)
