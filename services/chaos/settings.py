"""Settings of ``fatura chaos run``, read once from ``FATURA_CHAOS_*`` (and the common ones, which
say where the real PostgreSQL, RabbitMQ and Redis are)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.settings import CommonSettings, env_float, env_int, env_str


@dataclass(frozen=True)
class ChaosSettings:
    common: CommonSettings = field(default_factory=CommonSettings)
    # How long to wait, after a fault ends, for every job to finish and reach the ERP.
    drain_seconds: float = 120.0
    # How long the stack of one scenario may take to answer its readiness checks.
    start_seconds: float = 120.0
    # The simulated provider's mean latency (lognormal): what keeps a burst in flight for a while.
    provider_latency_ms: float = 500.0
    # The limiter pool's in-flight cap; the inference workers have more slots than this, so the
    # cap is what holds them back (and the invariant checks the provider never saw more).
    pool_max_in_flight: int = 6
    inference_workers: int = 2
    sample_seconds: float = 0.5  # timeline resolution
    rabbitmqctl: str = "rabbitmqctl"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ChaosSettings:
        env = os.environ if env is None else env
        return cls(
            common=CommonSettings.from_env(env),
            drain_seconds=env_float(env, "FATURA_CHAOS_DRAIN_SECONDS", cls.drain_seconds, lo=1, hi=86_400),
            start_seconds=env_float(env, "FATURA_CHAOS_START_SECONDS", cls.start_seconds, lo=5, hi=3_600),
            provider_latency_ms=env_float(
                env, "FATURA_CHAOS_PROVIDER_LATENCY_MS", cls.provider_latency_ms, lo=0, hi=60_000
            ),
            pool_max_in_flight=env_int(
                env, "FATURA_CHAOS_POOL_MAX_IN_FLIGHT", cls.pool_max_in_flight, lo=1, hi=10_000
            ),
            inference_workers=env_int(
                env, "FATURA_CHAOS_INFERENCE_WORKERS", cls.inference_workers, lo=1, hi=16
            ),
            sample_seconds=env_float(env, "FATURA_CHAOS_SAMPLE_SECONDS", cls.sample_seconds, lo=0.05, hi=60),
            rabbitmqctl=env_str(env, "FATURA_CHAOS_RABBITMQCTL", cls.rabbitmqctl),
        )
