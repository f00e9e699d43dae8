"""Settings of the optional Kafka processes, read once from ``FATURA_*``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.acceptance.settings import AcceptanceSettings
from services.common.settings import env_float, env_int, env_str, env_switch


@dataclass(frozen=True)
class KafkaSettings:
    """What both processes need to reach the cluster."""

    bootstrap_servers: str = "127.0.0.1:9092"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSettings:
        return cls(bootstrap_servers=env_str(env, "FATURA_KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))


@dataclass(frozen=True)
class IngressSettings:
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    topic: str = "fatura.extraction-requests"
    group_id: str = "fatura-kafka-ingress"
    dead_letter_topic: str = "fatura.extraction-requests.dead-letter"
    # Records being accepted at once; at the cap every partition is paused until one finishes.
    max_in_flight: int = 32
    # A partition paused by an admission refusal is resumed after the refusal's Retry-After, at most
    # this long, so a quota that frees early is noticed.
    max_pause_seconds: float = 30.0
    session_timeout_ms: int = 10_000
    max_poll_interval_ms: int = 300_000
    metrics_port: int = 9188

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IngressSettings:
        env = os.environ if env is None else env
        return cls(
            acceptance=AcceptanceSettings.from_env(env),
            kafka=KafkaSettings.from_env(env),
            topic=env_str(env, "FATURA_KAFKA_INGRESS_TOPIC", "fatura.extraction-requests"),
            group_id=env_str(env, "FATURA_KAFKA_INGRESS_GROUP", "fatura-kafka-ingress"),
            dead_letter_topic=env_str(
                env, "FATURA_KAFKA_DEAD_LETTER_TOPIC", "fatura.extraction-requests.dead-letter"
            ),
            max_in_flight=env_int(env, "FATURA_KAFKA_INGRESS_MAX_IN_FLIGHT", 32, lo=1, hi=10_000),
            max_pause_seconds=env_float(
                env, "FATURA_KAFKA_INGRESS_MAX_PAUSE_SECONDS", 30.0, lo=0.05, hi=3600
            ),
            session_timeout_ms=env_int(env, "FATURA_KAFKA_SESSION_TIMEOUT_MS", 10_000, lo=1000, hi=600_000),
            max_poll_interval_ms=env_int(
                env, "FATURA_KAFKA_MAX_POLL_INTERVAL_MS", 300_000, lo=1000, hi=3_600_000
            ),
            metrics_port=env_int(env, "FATURA_KAFKA_INGRESS_METRICS_PORT", 9188, lo=0, hi=65535),
        )

    def consumer_config(self) -> dict[str, Any]:
        return {
            "bootstrap.servers": self.kafka.bootstrap_servers,
            "group.id": self.group_id,
            # An offset is committed only once its record, and every one before it, is in the inbox.
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            # A rebalance moves only the partitions that change owner; the others keep running.
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": self.session_timeout_ms,
            "heartbeat.interval.ms": max(100, self.session_timeout_ms // 3),
            "max.poll.interval.ms": self.max_poll_interval_ms,
        }

    def producer_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.kafka.bootstrap_servers, "acks": "all", "enable.idempotence": True}


@dataclass(frozen=True)
class ExportSettings:
    acceptance: AcceptanceSettings = field(default_factory=AcceptanceSettings)
    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    # Off by default: the export is for audit and analytics consumers that want a Kafka topic.
    enabled: bool = False
    topic: str = "fatura.job-events"
    # The export's durable cursor in kafka_export_cursors; two exports to two topics use two names.
    name: str = "job-events"
    batch_size: int = 500
    poll_seconds: float = 0.5
    metrics_port: int = 9189

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ExportSettings:
        env = os.environ if env is None else env
        return cls(
            acceptance=AcceptanceSettings.from_env(env),
            kafka=KafkaSettings.from_env(env),
            enabled=env_switch(env, "FATURA_KAFKA_EXPORT", False),
            topic=env_str(env, "FATURA_KAFKA_EXPORT_TOPIC", "fatura.job-events"),
            name=env_str(env, "FATURA_KAFKA_EXPORT_NAME", "job-events"),
            batch_size=env_int(env, "FATURA_KAFKA_EXPORT_BATCH_SIZE", 500, lo=1, hi=100_000),
            poll_seconds=env_float(env, "FATURA_KAFKA_EXPORT_POLL_SECONDS", 0.5, lo=0.01, hi=600),
            metrics_port=env_int(env, "FATURA_KAFKA_EXPORT_METRICS_PORT", 9189, lo=0, hi=65535),
        )

    def producer_config(self) -> dict[str, Any]:
        # Idempotent: a retried send does not reorder or duplicate one job's events in a partition.
        return {"bootstrap.servers": self.kafka.bootstrap_servers, "acks": "all", "enable.idempotence": True}


def ingress_ready_url() -> str:
    return f"http://127.0.0.1:{IngressSettings.from_env().metrics_port}/readyz"


def export_ready_url() -> str:
    return f"http://127.0.0.1:{ExportSettings.from_env().metrics_port}/readyz"
