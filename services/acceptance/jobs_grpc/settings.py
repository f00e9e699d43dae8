"""Settings of the ``jobs-grpc`` process, read once from ``FATURA_JOBS_GRPC_*`` (and the acceptance
and event feed settings it shares with the HTTP edge: limits, admission, key cache, streams)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.acceptance.settings import AcceptanceSettings, EventSettings
from services.common.settings import SettingsError, env_int, env_str, env_switch, is_loopback


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


@dataclass(frozen=True)
class JobsGrpcSettings:
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    # The event feed Watch reads, with the edge's settings (poll, heartbeat, key recheck, buffers).
    events: EventSettings = field(default_factory=EventSettings)
    host: str = "127.0.0.1"
    port: int = 50051
    metrics_port: int = 9187
    reflection: bool = True
    # Server TLS. Callers send their API key as metadata: beyond loopback it must not cross in clear
    # unless something in front (a mesh sidecar) encrypts it, which allow_plaintext declares.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    allow_plaintext: bool = False

    def check_listener(self) -> None:
        """Before anything binds: beyond loopback, API keys travel over TLS (or a declared mesh)."""
        if is_loopback(self.host) or self.tls_cert is not None or self.allow_plaintext:
            return
        raise SettingsError(
            f"FATURA_JOBS_GRPC_HOST={self.host!r} is not a loopback address and FATURA_JOBS_GRPC_TLS_CERT "
            "is not set: callers' API keys would cross the network in clear. Set the TLS certificate "
            "and key, or FATURA_JOBS_GRPC_ALLOW_PLAINTEXT=1 when a proxy in front encrypts the traffic"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> JobsGrpcSettings:
        env = os.environ if env is None else env
        cert = _env_path(env, "FATURA_JOBS_GRPC_TLS_CERT")
        key = _env_path(env, "FATURA_JOBS_GRPC_TLS_KEY")
        if (cert is None) != (key is None):
            raise SettingsError("FATURA_JOBS_GRPC_TLS_CERT and FATURA_JOBS_GRPC_TLS_KEY must be set together")
        return cls(
            acceptance=AcceptanceSettings.from_env(env),
            events=EventSettings.from_env(env),
            host=env_str(env, "FATURA_JOBS_GRPC_HOST", cls.host),
            port=env_int(env, "FATURA_JOBS_GRPC_PORT", cls.port, lo=1, hi=65535),
            metrics_port=env_int(env, "FATURA_JOBS_GRPC_METRICS_PORT", cls.metrics_port, lo=1, hi=65535),
            reflection=env_switch(env, "FATURA_JOBS_GRPC_REFLECTION", cls.reflection),
            tls_cert=cert,
            tls_key=key,
            allow_plaintext=env_switch(env, "FATURA_JOBS_GRPC_ALLOW_PLAINTEXT", cls.allow_plaintext),
        )


def ready_url() -> str:
    settings = JobsGrpcSettings.from_env()
    host = settings.host if is_loopback(settings.host) else "127.0.0.1"
    return f"http://{host}:{settings.metrics_port}/readyz"
