"""Settings of the delivery processes (worker, scheduler) and of the webhook-endpoint API, read once."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.keyring import GENERATE_HINT, Keyring
from services.common.settings import CommonSettings, SettingsError, env_float, env_int, env_set
from services.delivery.egress import IPNetwork, parse_allow
from services.delivery.sender import SendLimits


@dataclass(frozen=True)
class DeliverySettings:
    common: CommonSettings = field(default_factory=CommonSettings)
    egress_allow: tuple[IPNetwork, ...] = ()
    retry_scale: float = 1.0
    auth_failure_limit: int = 3
    breaker_threshold: int = 5
    breaker_cooldown_seconds: float = 60.0
    lease_seconds: float = 60.0
    limits: SendLimits = field(default_factory=SendLimits)
    worker_threads: int = 8
    # Unacknowledged wake-ups one worker process holds per queue (None: four per thread). A thread
    # sending a batch holds its own; the batch's other wake-ups must flow past it to the idle
    # threads, which drop them, or the threads wait on RabbitMQ with work in the database.
    worker_prefetch: int | None = None
    # Due deliveries of one endpoint one wake-up may claim and send one after another.
    batch_size: int = 16
    worker_metrics_port: int = 9185
    scheduler_metrics_port: int = 9186
    scheduler_interval_seconds: float = 1.0
    rewake_seconds: float = 30.0
    secret_overlap_seconds: int = 86_400
    default_max_concurrency: int = 4
    # A delivery received (2xx) this long ago and not acknowledged by the ERP is listed by
    # GET /v1/deliveries?unacknowledged=1 and counted by the scheduler.
    ack_window_seconds: float = 3600.0
    # Seals webhook secrets (registration, rotation) and opens them (signing); None when
    # FATURA_SECRETS_KEY is unset, which only the processes that never touch a secret accept.
    keyring: Keyring | None = None

    def require_keyring(self, who: str) -> Keyring:
        """The keyring, or a settings error naming the process that cannot run without it."""
        if self.keyring is None:
            raise SettingsError(
                f"FATURA_SECRETS_KEY is not set: {who} seals or opens webhook secrets with it "
                f"(the same key in the edge and the delivery worker); {GENERATE_HINT}"
            )
        return self.keyring

    @property
    def prefetch(self) -> int:
        return self.worker_prefetch or 4 * self.worker_threads

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> DeliverySettings:
        env = os.environ if env is None else env
        try:
            allow = parse_allow(env_set(env, "FATURA_EGRESS_ALLOW"))
        except ValueError as exc:
            raise SettingsError(f"FATURA_EGRESS_ALLOW: {exc}") from None
        limits = SendLimits(
            connect_timeout=env_float(env, "FATURA_DELIVERY_CONNECT_TIMEOUT_SECONDS", 5.0, lo=0.05, hi=60),
            read_timeout=env_float(env, "FATURA_DELIVERY_READ_TIMEOUT_SECONDS", 10.0, lo=0.05, hi=120),
            total_timeout=env_float(env, "FATURA_DELIVERY_TOTAL_TIMEOUT_SECONDS", 15.0, lo=0.1, hi=300),
            max_response_bytes=env_int(env, "FATURA_DELIVERY_MAX_RESPONSE_BYTES", 4096, lo=0, hi=65536),
        )
        lease = env_float(env, "FATURA_DELIVERY_LEASE_SECONDS", 60.0, lo=0.5, hi=3600)
        if lease <= limits.total_timeout:
            raise SettingsError(
                f"FATURA_DELIVERY_LEASE_SECONDS={lease} must exceed "
                f"FATURA_DELIVERY_TOTAL_TIMEOUT_SECONDS={limits.total_timeout}: a lease must outlive a POST"
            )
        threads = env_int(env, "FATURA_DELIVERY_WORKER_THREADS", 8, lo=1, hi=256)
        return cls(
            common=CommonSettings.from_env(env),
            egress_allow=allow,
            retry_scale=env_float(env, "FATURA_DELIVERY_RETRY_SCALE", 1.0, lo=0.0001, hi=100),
            auth_failure_limit=env_int(env, "FATURA_DELIVERY_AUTH_FAILURE_LIMIT", 3, lo=1, hi=1000),
            breaker_threshold=env_int(env, "FATURA_DELIVERY_BREAKER_THRESHOLD", 5, lo=1, hi=10_000),
            breaker_cooldown_seconds=env_float(
                env, "FATURA_DELIVERY_BREAKER_COOLDOWN_SECONDS", 60.0, lo=0.01, hi=86_400
            ),
            lease_seconds=lease,
            limits=limits,
            worker_threads=threads,
            worker_prefetch=env_int(env, "FATURA_DELIVERY_WORKER_PREFETCH", 4 * threads, lo=1, hi=65_535),
            batch_size=env_int(env, "FATURA_DELIVERY_BATCH_SIZE", 16, lo=1, hi=64),
            worker_metrics_port=env_int(env, "FATURA_DELIVERY_WORKER_METRICS_PORT", 9185, lo=0, hi=65535),
            scheduler_metrics_port=env_int(
                env, "FATURA_DELIVERY_SCHEDULER_METRICS_PORT", 9186, lo=0, hi=65535
            ),
            scheduler_interval_seconds=env_float(
                env, "FATURA_DELIVERY_SCHEDULER_INTERVAL_SECONDS", 1.0, lo=0.01, hi=600
            ),
            rewake_seconds=env_float(env, "FATURA_DELIVERY_REWAKE_SECONDS", 30.0, lo=0.1, hi=86_400),
            secret_overlap_seconds=env_int(
                env, "FATURA_WEBHOOK_SECRET_OVERLAP_SECONDS", 86_400, lo=0, hi=30 * 86_400
            ),
            default_max_concurrency=env_int(env, "FATURA_WEBHOOK_MAX_CONCURRENCY", 4, lo=1, hi=1000),
            ack_window_seconds=env_float(env, "FATURA_ERP_ACK_WINDOW_SECONDS", 3600.0, lo=0, hi=30 * 86_400),
            keyring=Keyring.from_env(env),
        )


def worker_ready_url() -> str:
    return f"http://127.0.0.1:{DeliverySettings.from_env().worker_metrics_port}/readyz"


def scheduler_ready_url() -> str:
    return f"http://127.0.0.1:{DeliverySettings.from_env().scheduler_metrics_port}/readyz"
