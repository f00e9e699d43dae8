"""Settings of the acceptance processes (HTTP edge and outbox relay), read once from ``FATURA_*``."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from services.common.events import MAX_EVENTS_PER_MESSAGE
from services.common.settings import CommonSettings, env_float, env_int, env_str

MIB = 1024 * 1024


@dataclass(frozen=True)
class AcceptanceSettings:
    common: CommonSettings = field(default_factory=CommonSettings)
    http_host: str = "127.0.0.1"
    http_port: int = 8080
    http_workers: int = 2
    # Database connections per edge process (each HTTP worker, the gRPC JobService): a request holds
    # one only for its statement's round trip, and a few connections kept busy cost PostgreSQL less
    # per statement than many that each wake for every tenth request.
    edge_db_pool_max: int = 4
    # The fast path's writes of one process (services/acceptance/group_write.py): at most this many
    # transactions at once, and the writes that queue meanwhile commit together, this many at most.
    accept_writers: int = 2
    accept_group_max: int = 32
    metrics_port: int = 9180
    max_document_bytes: int = 2 * MIB
    max_system_backlog: int = 200_000
    admission_retry_after_seconds: int = 30
    backlog_retry_after_seconds: int = 60
    max_output_tokens: int = 2048
    prompt_overhead_tokens: int = 600
    expected_jobs_per_second: float = 1.5
    default_deadline_seconds: int = 86_400
    auth_cache_seconds: float = 5.0
    # Invalid keys presented from one address within a minute before it is blocked; 0 turns it off.
    auth_failure_limit: int = 30
    auth_block_seconds: float = 300.0
    admission_cache_seconds: float = 0.1
    model_policy: str = "default"
    policy_version: str = "invoice-policy.v2"
    max_batch_items: int = 10_000
    # A batch body carries every inline document at once; larger documents go by id (uploaded
    # first with POST /v1/documents), so the batch body has a cap of its own.
    max_batch_body_bytes: int = 32 * MIB

    @property
    def max_body_bytes(self) -> int:
        # JSON escaping can double a text's size; the document cap itself is checked after parsing.
        return 2 * self.max_document_bytes + 64 * 1024

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AcceptanceSettings:
        env = os.environ if env is None else env
        return cls(
            common=CommonSettings.from_env(env),
            http_host=env_str(env, "FATURA_HTTP_HOST", "127.0.0.1"),
            http_port=env_int(env, "FATURA_HTTP_PORT", 8080, lo=1, hi=65535),
            http_workers=env_int(env, "FATURA_HTTP_WORKERS", 2, lo=1, hi=64),
            edge_db_pool_max=env_int(env, "FATURA_EDGE_DB_POOL_MAX", 4, lo=1, hi=200),
            accept_writers=env_int(env, "FATURA_ACCEPT_WRITERS", 2, lo=1, hi=200),
            accept_group_max=env_int(env, "FATURA_ACCEPT_GROUP_MAX", 32, lo=1, hi=1000),
            metrics_port=env_int(env, "FATURA_HTTP_METRICS_PORT", 9180, lo=1, hi=65535),
            max_document_bytes=env_int(env, "FATURA_MAX_DOCUMENT_BYTES", 2 * MIB, lo=1024, hi=64 * MIB),
            max_system_backlog=env_int(env, "FATURA_MAX_SYSTEM_BACKLOG", 200_000, lo=0),
            admission_retry_after_seconds=env_int(env, "FATURA_ADMISSION_RETRY_AFTER_SECONDS", 30, lo=1),
            backlog_retry_after_seconds=env_int(env, "FATURA_BACKLOG_RETRY_AFTER_SECONDS", 60, lo=1),
            max_output_tokens=env_int(env, "FATURA_MAX_OUTPUT_TOKENS", 2048, lo=1, hi=1_000_000),
            prompt_overhead_tokens=env_int(env, "FATURA_PROMPT_OVERHEAD_TOKENS", 600, lo=0, hi=1_000_000),
            expected_jobs_per_second=env_float(
                env, "FATURA_EXPECTED_JOBS_PER_SECOND", 1.5, lo=0.001, hi=1_000_000
            ),
            default_deadline_seconds=env_int(
                env, "FATURA_DEFAULT_DEADLINE_SECONDS", 86_400, lo=60, hi=604_800
            ),
            auth_cache_seconds=env_float(env, "FATURA_AUTH_CACHE_SECONDS", 5.0, lo=0.0, hi=3600.0),
            auth_failure_limit=env_int(env, "FATURA_AUTH_FAILURE_LIMIT", 30, lo=0, hi=1_000_000),
            auth_block_seconds=env_float(env, "FATURA_AUTH_BLOCK_SECONDS", 300.0, lo=1.0, hi=86_400.0),
            admission_cache_seconds=env_float(env, "FATURA_ADMISSION_CACHE_SECONDS", 0.1, lo=0.0, hi=10.0),
            model_policy=env_str(env, "FATURA_MODEL_POLICY", "default"),
            policy_version=env_str(env, "FATURA_POLICY_VERSION", "invoice-policy.v2"),
            max_batch_items=env_int(env, "FATURA_MAX_BATCH_ITEMS", 10_000, lo=1, hi=100_000),
            max_batch_body_bytes=env_int(
                env, "FATURA_MAX_BATCH_BODY_BYTES", 32 * MIB, lo=64 * 1024, hi=1024 * MIB
            ),
        )


@dataclass(frozen=True)
class RelaySettings:
    common: CommonSettings = field(default_factory=CommonSettings)
    batch_size: int = 200
    # Events of one claimed batch bound for the same queue share a message, up to this many
    # (services/common/event_batches.py); 1 sends each event in a message of its own.
    events_per_message: int = 16
    claim_timeout_seconds: float = 30.0
    sweep_interval_seconds: float = 1.0
    metrics_port: int = 9181
    relay_id: str = ""
    # Documents no job references are deleted this many days after they were stored.
    document_retention_days: float = 30.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RelaySettings:
        env = os.environ if env is None else env
        return cls(
            common=CommonSettings.from_env(env),
            batch_size=env_int(env, "FATURA_RELAY_BATCH_SIZE", 200, lo=1, hi=10_000),
            events_per_message=env_int(
                env, "FATURA_RELAY_EVENTS_PER_MESSAGE", 16, lo=1, hi=MAX_EVENTS_PER_MESSAGE
            ),
            claim_timeout_seconds=env_float(env, "FATURA_RELAY_CLAIM_TIMEOUT_SECONDS", 30.0, lo=0.1, hi=3600),
            sweep_interval_seconds=env_float(env, "FATURA_RELAY_SWEEP_SECONDS", 1.0, lo=0.01, hi=600),
            metrics_port=env_int(env, "FATURA_RELAY_METRICS_PORT", 9181, lo=0, hi=65535),
            document_retention_days=env_float(
                env, "FATURA_DOCUMENT_RETENTION_DAYS", 30.0, lo=0.001, hi=36_500
            ),
            relay_id=env_str(env, "FATURA_RELAY_ID", f"{socket.gethostname()}:{os.getpid()}"),
        )


def http_ready_url() -> str:
    http = AcceptanceSettings.from_env()
    return f"http://{http.http_host}:{http.http_port}/readyz"


def relay_ready_url() -> str:
    return f"http://127.0.0.1:{RelaySettings.from_env().metrics_port}/readyz"


@dataclass(frozen=True)
class EventSettings:
    """The job event feed (``services/acceptance/feed.py``): SSE at the edge, ``Watch`` in gRPC, and
    the relay's pruning of old events."""

    # Events older than this are deleted by the relay; a client resuming from before them gets a
    # snapshot of its jobs instead.
    retention_hours: float = 720.0
    # While streams are open, the feed reads new events at least this often (a commit that writes an
    # outbox event wakes it at once).
    poll_seconds: float = 0.1
    heartbeat_seconds: float = 15.0
    # How often the keys of open streams are looked up again: a revoked key's stream ends within it.
    auth_recheck_seconds: float = 5.0
    # Events queued for one slow stream before it stops taking live events and catches up from the
    # database instead (its memory stays bounded).
    subscriber_buffer: int = 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> EventSettings:
        env = os.environ if env is None else env
        return cls(
            retention_hours=env_float(env, "FATURA_EVENT_RETENTION_HOURS", 720.0, lo=0.001, hi=876_000),
            poll_seconds=env_float(env, "FATURA_EVENT_POLL_SECONDS", 0.1, lo=0.005, hi=60.0),
            heartbeat_seconds=env_float(env, "FATURA_EVENT_HEARTBEAT_SECONDS", 15.0, lo=0.05, hi=3600.0),
            auth_recheck_seconds=env_float(env, "FATURA_EVENT_AUTH_RECHECK_SECONDS", 5.0, lo=0.05, hi=3600.0),
            subscriber_buffer=env_int(env, "FATURA_EVENT_SUBSCRIBER_BUFFER", 1000, lo=1, hi=1_000_000),
        )
