"""Gateway settings, read once from ``FATURA_PROVIDER_*`` variables (DESIGN §5.6).

The routing chains themselves live in the TOML file ``FATURA_PROVIDER_CONFIG`` names
(``catalog.py``); ``FATURA_PROVIDER_BASE_URL`` replaces that file by a one-channel chain.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from services.common.settings import SettingsError, env_float, env_int, env_str

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_CONFIG = ROOT / "deploy" / "local" / "providers.toml"
SIMULATED_MODEL = "fatura-sim-1"


@dataclass(frozen=True)
class BreakerPolicy:
    """Seed 001, layer 1: ``failures`` within ``window_ms`` open a channel for ``cooldown_ms``."""

    failures: int = 3
    window_ms: int = 300_000
    cooldown_ms: int = 60_000
    # How long one half-open trial call may hold the channel before another may try: a worker
    # that died mid-trial must not keep the channel shut for good. One attempt's deadline.
    trial_ms: int = 45_000


@dataclass(frozen=True)
class EndpointOverride:
    """``FATURA_PROVIDER_BASE_URL`` and friends: one OpenAI-compatible endpoint, nothing else."""

    base_url: str
    api_key: str | None
    model: str
    pool: str


@dataclass(frozen=True)
class GatewaySettings:
    config_path: Path = DEFAULT_CONFIG
    override: EndpointOverride | None = None
    default_model: str | None = None  # FATURA_PROVIDER_MODEL without a base URL picks the file's model
    attempt_deadline_s: float = 45.0  # the worker's default ProviderRequest.deadline_s
    header_timeout_s: float = 240.0
    connect_timeout_s: float = 10.0
    stream_gate_s: float = 30.0
    max_response_bytes: int = 4 * 1024 * 1024
    max_connections: int = 100
    default_retry_after_ms: int = 1_000  # a 429 without Retry-After still pauses the pool this long
    breaker: BreakerPolicy = BreakerPolicy()
    breaker_prefix: str = "fatura:breaker"
    breaker_healthy_cache_ms: int = 1_000  # how long a process trusts "no recent failure"
    redis_url: str = "redis://127.0.0.1:6379/0"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        raw_path = Path(env_str(env, "FATURA_PROVIDER_CONFIG", str(cls.config_path)))
        model = env.get("FATURA_PROVIDER_MODEL", "").strip() or None
        base_url = env.get("FATURA_PROVIDER_BASE_URL", "").strip()
        override = None
        if base_url:
            if not base_url.startswith(("http://", "https://")):
                raise SettingsError(f"FATURA_PROVIDER_BASE_URL={base_url!r} is not an http(s) URL")
            override = EndpointOverride(
                base_url=base_url.rstrip("/"),
                api_key=env.get("FATURA_PROVIDER_API_KEY", "").strip() or None,
                # The simulator's model and pool unless told otherwise (DESIGN §7: pointing the
                # worker at another endpoint needs nothing else).
                model=model or SIMULATED_MODEL,
                pool=env_str(env, "FATURA_PROVIDER_POOL", "sandbox"),
            )
        # A deployment's namespace (each test run has its own queue prefix), so a run's open breakers
        # never close channels for another run or a demo sharing the Redis.
        namespace = env_str(env, "FATURA_QUEUE_PREFIX", "fatura")
        prefix = env_str(env, "FATURA_PROVIDER_BREAKER_PREFIX", f"{namespace}:breaker")
        if any(ch in prefix for ch in "{} "):
            raise SettingsError(
                f"FATURA_PROVIDER_BREAKER_PREFIX={prefix!r} may not hold '{{', '}}' or spaces"
            )
        cooldown_s = env_float(env, "FATURA_PROVIDER_BREAKER_COOLDOWN_SECONDS", 60.0, lo=0.05, hi=86_400)
        # The inference worker's own attempt deadline: one variable for one budget.
        deadline_s = env_float(env, "FATURA_ATTEMPT_DEADLINE_SECONDS", 45.0, lo=0.5, hi=3_600)
        return cls(
            config_path=raw_path if raw_path.is_absolute() else ROOT / raw_path,
            override=override,
            default_model=model,
            attempt_deadline_s=deadline_s,
            header_timeout_s=env_float(
                env, "FATURA_PROVIDER_HEADER_TIMEOUT_SECONDS", 240.0, lo=0.05, hi=3_600
            ),
            connect_timeout_s=env_float(
                env, "FATURA_PROVIDER_CONNECT_TIMEOUT_SECONDS", 10.0, lo=0.05, hi=600
            ),
            stream_gate_s=env_float(env, "FATURA_PROVIDER_STREAM_GATE_SECONDS", 30.0, lo=0.0, hi=3_600),
            max_response_bytes=env_int(
                env, "FATURA_PROVIDER_MAX_RESPONSE_BYTES", cls.max_response_bytes, lo=1_024, hi=1 << 30
            ),
            max_connections=env_int(
                env, "FATURA_PROVIDER_MAX_CONNECTIONS", cls.max_connections, lo=1, hi=10_000
            ),
            default_retry_after_ms=env_int(
                env, "FATURA_PROVIDER_DEFAULT_RETRY_AFTER_MS", cls.default_retry_after_ms, lo=1, hi=3_600_000
            ),
            breaker=BreakerPolicy(
                failures=env_int(env, "FATURA_PROVIDER_BREAKER_FAILURES", 3, lo=1, hi=1_000),
                window_ms=int(
                    1000 * env_float(env, "FATURA_PROVIDER_BREAKER_WINDOW_SECONDS", 300.0, lo=0.05, hi=86_400)
                ),
                cooldown_ms=int(1000 * cooldown_s),
                trial_ms=int(1000 * deadline_s),
            ),
            breaker_prefix=prefix,
            breaker_healthy_cache_ms=env_int(
                env, "FATURA_PROVIDER_BREAKER_HEALTHY_CACHE_MS", cls.breaker_healthy_cache_ms, lo=0, hi=60_000
            ),
            redis_url=env_str(env, "FATURA_REDIS_URL", cls.redis_url),
        )
