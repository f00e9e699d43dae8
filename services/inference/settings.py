"""Settings of the inference worker and scheduler, read once from ``FATURA_*`` variables."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from services.common.settings import CommonSettings, env_float, env_int, env_str


@dataclass(frozen=True)
class InferenceSettings:
    common: CommonSettings
    worker_id: str
    # Dramatiq threads take deliveries (ingest, wake-ups); execution slots make the model calls.
    # Their inbox writes share transactions (services/common/groupcommit.py): the more threads,
    # the more events one transaction takes in during a burst.
    threads: int = 8
    concurrency: int = 8
    metrics_port: int = 9183
    scheduler_metrics_port: int = 9184
    model: str = "fatura-sim-1"
    limiter_pool: str = "sandbox"
    max_output_tokens: int = 2048
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    attempt_deadline_seconds: float = 45.0
    max_attempts: int = 5
    retry_cap_seconds: float = 60.0
    retry_base_seconds: float = 2.0
    deadline_margin_seconds: float = 5.0
    priority_aging_seconds: float = 30.0
    scheduler_interval_seconds: float = 1.0
    scheduler_batch: int = 200
    wakeup_target: int = 64
    slot_wait_seconds: float = 30.0
    wake_coalesce_seconds: float = 0.1
    supplier_cache: int = 50_000
    tenant_loads_seconds: float = 0.1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> InferenceSettings:
        env = os.environ if env is None else env
        return cls(
            common=CommonSettings.from_env(env),
            worker_id=env_str(env, "FATURA_WORKER_ID", f"{socket.gethostname()}:{os.getpid()}"),
            threads=env_int(env, "FATURA_INFERENCE_THREADS", 8, lo=1, hi=64),
            concurrency=env_int(env, "FATURA_INFERENCE_CONCURRENCY", 8, lo=1, hi=1024),
            metrics_port=env_int(env, "FATURA_INFERENCE_METRICS_PORT", 9183, lo=0, hi=65535),
            scheduler_metrics_port=env_int(env, "FATURA_SCHEDULER_METRICS_PORT", 9184, lo=0, hi=65535),
            model=env_str(env, "FATURA_INFERENCE_MODEL", "fatura-sim-1"),
            limiter_pool=env_str(env, "FATURA_INFERENCE_LIMITER_POOL", "sandbox"),
            max_output_tokens=env_int(env, "FATURA_MAX_OUTPUT_TOKENS", 2048, lo=1, hi=1_000_000),
            lease_seconds=env_float(env, "FATURA_LEASE_SECONDS", 30.0, lo=0.5, hi=3600),
            heartbeat_seconds=env_float(env, "FATURA_HEARTBEAT_SECONDS", 10.0, lo=0.1, hi=600),
            attempt_deadline_seconds=env_float(env, "FATURA_ATTEMPT_DEADLINE_SECONDS", 45.0, lo=0.5, hi=3600),
            max_attempts=env_int(env, "FATURA_MAX_ATTEMPTS", 5, lo=1, hi=100),
            retry_cap_seconds=env_float(env, "FATURA_RETRY_CAP_SECONDS", 60.0, lo=0.0, hi=86400),
            retry_base_seconds=env_float(env, "FATURA_RETRY_BASE_SECONDS", 2.0, lo=0.0, hi=3600),
            deadline_margin_seconds=env_float(env, "FATURA_DEADLINE_MARGIN_SECONDS", 5.0, lo=0.0, hi=3600),
            priority_aging_seconds=env_float(env, "FATURA_PRIORITY_AGING_SECONDS", 30.0, lo=0.0, hi=86400),
            scheduler_interval_seconds=env_float(
                env, "FATURA_SCHEDULER_INTERVAL_SECONDS", 1.0, lo=0.05, hi=60
            ),
            scheduler_batch=env_int(env, "FATURA_SCHEDULER_BATCH", 200, lo=1, hi=10_000),
            wakeup_target=env_int(env, "FATURA_WAKEUP_TARGET", 64, lo=1, hi=100_000),
            slot_wait_seconds=env_float(env, "FATURA_SLOT_WAIT_SECONDS", 30.0, lo=0.0, hi=3600),
            wake_coalesce_seconds=env_float(env, "FATURA_WAKE_COALESCE_SECONDS", 0.1, lo=0.0, hi=60),
            supplier_cache=env_int(env, "FATURA_INFERENCE_SUPPLIER_CACHE", 50_000, lo=0, hi=100_000_000),
            tenant_loads_seconds=env_float(env, "FATURA_TENANT_LOADS_SECONDS", 0.1, lo=0.0, hi=10.0),
        )

    @property
    def time_limit_ms(self) -> int:
        """Dramatiq's TimeLimit for an actor: above an attempt's deadline, far below RabbitMQ's
        consumer_timeout (30 min by default)."""
        return int((self.attempt_deadline_seconds + self.slot_wait_seconds + 60) * 1000)


def worker_ready_url() -> str:
    return f"http://127.0.0.1:{InferenceSettings.from_env().metrics_port}/readyz"


def scheduler_ready_url() -> str:
    return f"http://127.0.0.1:{InferenceSettings.from_env().scheduler_metrics_port}/readyz"
