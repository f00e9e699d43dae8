"""Limiter settings, read once from ``FATURA_LIMITER_*`` variables (server and client side), including
who may call it: the shared token, TLS files and the reflection switch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from services.common.settings import SettingsError, env_float, env_int, env_str, env_switch, is_loopback

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "deploy" / "local" / "limiter.toml"
MIN_TOKEN_LENGTH = 16


def _env_token(env: Mapping[str, str], name: str) -> str | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    # The value never appears in an error message or a log line, only its shape.
    if len(raw) < MIN_TOKEN_LENGTH or not all("!" <= ch <= "~" for ch in raw):
        raise SettingsError(
            f"{name} must be at least {MIN_TOKEN_LENGTH} visible ASCII characters without spaces "
            "(its value is not shown)"
        )
    return raw


def _env_path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    if raw == "":
        return None
    path = Path(raw)
    return path if path.is_absolute() else ROOT / path


def _together(first: tuple[str, Path | None], second: tuple[str, Path | None]) -> None:
    if (first[1] is None) != (second[1] is None):
        raise SettingsError(f"{first[0]} and {second[0]} must be set together")


@dataclass(frozen=True)
class LimiterSettings:
    config_path: Path = DEFAULT_CONFIG
    # Server
    host: str = "127.0.0.1"
    port: int = 50052
    metrics_port: int = 9182
    redis_connections: int = 4  # pipelines of script calls in flight to Redis at once
    key_prefix: str = "fatura:limiter"
    redis_timeout_ms: int = 250
    default_lease_ms: int = 60_000
    max_lease_ms: int = 300_000
    max_tokens: int = 2_000_000  # per Acquire (input + output); above is INVALID_ARGUMENT
    max_cooldown_ms: int = 3_600_000
    permit_retention_ms: int = 3_600_000  # how long a permit record outlives its lease
    # Client
    address: str = "127.0.0.1:50052"
    # An Acquire that misses it is a denial that defers the job: at 50 ms, a loaded machine's
    # ordinary latency turned into more deferrals than jobs (docs/benchmarks.md, pipeline).
    deadline_ms: int = 250
    # Release, Renew and ReportThrottle settle what is already held: a missed deadline there keeps a
    # permit (and a pool slot) until its lease ends, so they may wait longer than an Acquire.
    settle_deadline_ms: int = 1_000
    emergency_share: float = 0.0  # share of a pool's in-flight/RPM/TPM one process may use unreached
    unavailable_retry_ms: int = 1_000
    # Who may call (both sides). The token is sent by the client and required by the server on every
    # LimiterService RPC when set; repr=False keeps it out of any printed settings.
    token: str | None = field(default=None, repr=False)
    reflection: bool = True
    # Server TLS: certificate and key; with a client CA, client certificates are required (mTLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # Client TLS: the CA that signed the server's certificate, and the client's own certificate.
    tls_ca: Path | None = None
    tls_client_cert: Path | None = None
    tls_client_key: Path | None = None

    def check_listener(self) -> None:
        """Server side, before anything binds: a limiter reachable from other machines must
        authenticate its callers (a token, or client certificates), so it is never exposed by accident."""
        if is_loopback(self.host) or self.token is not None or self.tls_client_ca is not None:
            return
        raise SettingsError(
            f"FATURA_LIMITER_HOST={self.host!r} is not a loopback address, and neither "
            "FATURA_LIMITER_TOKEN nor mutual TLS (FATURA_LIMITER_TLS_CERT, FATURA_LIMITER_TLS_KEY, "
            "FATURA_LIMITER_TLS_CLIENT_CA) is set: the limiter will not listen beyond loopback "
            "unauthenticated"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LimiterSettings:
        env = os.environ if env is None else env
        raw_path = Path(env_str(env, "FATURA_LIMITER_CONFIG", str(cls.config_path)))
        prefix = env_str(env, "FATURA_LIMITER_KEY_PREFIX", cls.key_prefix)
        if any(ch in prefix for ch in "{} "):
            raise SettingsError(f"FATURA_LIMITER_KEY_PREFIX={prefix!r} may not hold '{{', '}}' or spaces")
        max_lease = env_int(env, "FATURA_LIMITER_MAX_LEASE_MS", cls.max_lease_ms, lo=1_000, hi=86_400_000)
        port = env_int(env, "FATURA_LIMITER_PORT", cls.port, lo=1, hi=65535)
        cert = ("FATURA_LIMITER_TLS_CERT", _env_path(env, "FATURA_LIMITER_TLS_CERT"))
        key = ("FATURA_LIMITER_TLS_KEY", _env_path(env, "FATURA_LIMITER_TLS_KEY"))
        client_ca = ("FATURA_LIMITER_TLS_CLIENT_CA", _env_path(env, "FATURA_LIMITER_TLS_CLIENT_CA"))
        _together(cert, key)
        if client_ca[1] is not None and cert[1] is None:
            raise SettingsError("FATURA_LIMITER_TLS_CLIENT_CA needs FATURA_LIMITER_TLS_CERT and _KEY")
        ca = ("FATURA_LIMITER_TLS_CA", _env_path(env, "FATURA_LIMITER_TLS_CA"))
        client_cert = ("FATURA_LIMITER_TLS_CLIENT_CERT", _env_path(env, "FATURA_LIMITER_TLS_CLIENT_CERT"))
        client_key = ("FATURA_LIMITER_TLS_CLIENT_KEY", _env_path(env, "FATURA_LIMITER_TLS_CLIENT_KEY"))
        _together(client_cert, client_key)
        if client_cert[1] is not None and ca[1] is None:
            raise SettingsError("FATURA_LIMITER_TLS_CLIENT_CERT needs FATURA_LIMITER_TLS_CA")
        return cls(
            config_path=raw_path if raw_path.is_absolute() else ROOT / raw_path,
            host=env_str(env, "FATURA_LIMITER_HOST", cls.host),
            port=port,
            metrics_port=env_int(env, "FATURA_LIMITER_METRICS_PORT", cls.metrics_port, lo=1, hi=65535),
            redis_connections=env_int(
                env, "FATURA_LIMITER_REDIS_CONNECTIONS", cls.redis_connections, lo=1, hi=1024
            ),
            key_prefix=prefix,
            redis_timeout_ms=env_int(
                env, "FATURA_LIMITER_REDIS_TIMEOUT_MS", cls.redis_timeout_ms, lo=10, hi=60_000
            ),
            default_lease_ms=env_int(
                env,
                "FATURA_LIMITER_DEFAULT_LEASE_MS",
                min(cls.default_lease_ms, max_lease),
                lo=100,
                hi=max_lease,
            ),
            max_lease_ms=max_lease,
            max_tokens=env_int(env, "FATURA_LIMITER_MAX_TOKENS", cls.max_tokens, lo=1, hi=10**12),
            max_cooldown_ms=env_int(
                env, "FATURA_LIMITER_MAX_COOLDOWN_MS", cls.max_cooldown_ms, lo=1, hi=86_400_000
            ),
            permit_retention_ms=env_int(
                env,
                "FATURA_LIMITER_PERMIT_RETENTION_MS",
                cls.permit_retention_ms,
                lo=1_000,
                hi=7 * 86_400_000,
            ),
            address=env_str(env, "FATURA_LIMITER_ADDRESS", f"127.0.0.1:{port}"),
            deadline_ms=env_int(env, "FATURA_LIMITER_DEADLINE_MS", cls.deadline_ms, lo=1, hi=60_000),
            settle_deadline_ms=env_int(
                env, "FATURA_LIMITER_SETTLE_DEADLINE_MS", cls.settle_deadline_ms, lo=1, hi=60_000
            ),
            emergency_share=env_float(
                env, "FATURA_LIMITER_EMERGENCY_SHARE", cls.emergency_share, lo=0.0, hi=1.0
            ),
            unavailable_retry_ms=env_int(
                env, "FATURA_LIMITER_UNAVAILABLE_RETRY_MS", cls.unavailable_retry_ms, lo=1, hi=3_600_000
            ),
            token=_env_token(env, "FATURA_LIMITER_TOKEN"),
            reflection=env_switch(env, "FATURA_LIMITER_REFLECTION", cls.reflection),
            tls_cert=cert[1],
            tls_key=key[1],
            tls_client_ca=client_ca[1],
            tls_ca=ca[1],
            tls_client_cert=client_cert[1],
            tls_client_key=client_key[1],
        )


def ready_url() -> str:
    limiter = LimiterSettings.from_env()
    return f"http://{limiter.host}:{limiter.metrics_port}/readyz"
