"""Settings read once from ``FATURA_*`` environment variables; a bad value fails fast with its name."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass, field


class SettingsError(ValueError):
    """A ``FATURA_*`` variable holds a value the process cannot run with."""


def _raw(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    if value is None or value.strip() == "":
        return None
    return value.strip()


def env_str(env: Mapping[str, str], name: str, default: str) -> str:
    return _raw(env, name) or default


def env_int(env: Mapping[str, str], name: str, default: int, *, lo: int = 0, hi: int = 2**62) -> int:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def env_float(
    env: Mapping[str, str], name: str, default: float, *, lo: float = 0.0, hi: float = 1e12
) -> float:
    raw = _raw(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not lo <= value <= hi:
        raise SettingsError(f"{name}={value} is outside [{lo}, {hi}]")
    return value


def env_set(env: Mapping[str, str], name: str) -> frozenset[str]:
    raw = _raw(env, name)
    if raw is None:
        return frozenset()
    return frozenset(part.strip() for part in raw.split(",") if part.strip())


_ON = frozenset({"1", "true", "yes", "on"})
_OFF = frozenset({"0", "false", "no", "off"})


def env_switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw == "":
        return default
    if raw in _ON:
        return True
    if raw in _OFF:
        return False
    raise SettingsError(f"{name}={raw!r} is not one of 1, 0, true, false, yes, no, on, off")


def is_loopback(host: str) -> bool:
    """True when a listening ``host`` can only be reached from this machine. A name other than
    ``localhost`` counts as reachable from elsewhere: what it resolves to is not known here."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class CommonSettings:
    """Connections and switches every process needs."""

    database_url: str = "postgresql://postgres@127.0.0.1:5432/fatura"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    redis_url: str = "redis://127.0.0.1:6379/0"
    queue_prefix: str = "fatura"
    db_pool_min: int = 1
    db_pool_max: int = 10
    # How long a caller waits for a connection from a full or reconnecting pool before it fails as
    # database-unavailable (a 503 at the edge, UNAVAILABLE in gRPC, a redelivery for a consumer).
    db_pool_timeout_seconds: float = 10.0
    faults: frozenset[str] = field(default_factory=frozenset)
    log_level: str = "INFO"
    # json, text, or auto (text on a terminal, JSON lines otherwise): services/common/logs.py.
    log_format: str = "auto"
    # Finished spans are also appended here as JSON lines (tests, local debugging); the exporter
    # proper is chosen by the standard OTEL_* variables (services/common/tracing.py).
    trace_file: str | None = None
    # A message whose consumer met a transient failure comes back after full-jitter backoff
    # between these bounds; an unexpected error is redelivered this many times, then dead-lettered.
    redelivery_min_ms: int = 500
    redelivery_max_ms: int = 30_000
    unexpected_redeliveries: int = 5
    # The reconciler re-drives an event no consumer took in once it is this old (and no older than
    # the horizon when the process starts); dead letters are kept this many days.
    reconcile_grace_seconds: float = 60.0
    reconcile_horizon_seconds: float = 3600.0
    dead_letter_retention_days: float = 14.0
    # Each service's sessions act as its own database role (services/common/db.py).
    db_roles: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CommonSettings:
        env = os.environ if env is None else env
        prefix = env_str(env, "FATURA_QUEUE_PREFIX", cls.queue_prefix)
        if not prefix.replace("_", "").replace("-", "").isalnum():
            raise SettingsError(f"FATURA_QUEUE_PREFIX={prefix!r} may hold only letters, digits, '-' and '_'")
        level = env_str(env, "FATURA_LOG_LEVEL", cls.log_level).upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise SettingsError(f"FATURA_LOG_LEVEL={level!r} is not one of DEBUG, INFO, WARNING, ERROR")
        log_format = env_str(env, "FATURA_LOG_FORMAT", cls.log_format).lower()
        if log_format not in {"auto", "json", "text"}:
            raise SettingsError(f"FATURA_LOG_FORMAT={log_format!r} is not one of auto, json, text")
        pool_min = env_int(env, "FATURA_DB_POOL_MIN", cls.db_pool_min, lo=0, hi=200)
        redelivery_min = env_int(env, "FATURA_REDELIVERY_MIN_MS", cls.redelivery_min_ms, lo=10, hi=600_000)
        db_roles = env_str(env, "FATURA_DB_ROLES", "1").lower()
        if db_roles not in {"0", "1", "true", "false"}:
            raise SettingsError(f"FATURA_DB_ROLES={db_roles!r} is not one of 1, 0, true, false")
        return cls(
            database_url=env_str(env, "FATURA_DATABASE_URL", cls.database_url),
            amqp_url=env_str(env, "FATURA_AMQP_URL", cls.amqp_url),
            redis_url=env_str(env, "FATURA_REDIS_URL", cls.redis_url),
            queue_prefix=prefix,
            db_pool_min=pool_min,
            db_pool_max=env_int(env, "FATURA_DB_POOL_MAX", cls.db_pool_max, lo=max(1, pool_min), hi=200),
            db_pool_timeout_seconds=env_float(
                env, "FATURA_DB_POOL_TIMEOUT_SECONDS", cls.db_pool_timeout_seconds, lo=0.1, hi=600.0
            ),
            faults=env_set(env, "FATURA_FAULTS"),
            log_level=level,
            log_format=log_format,
            trace_file=env_str(env, "FATURA_TRACE_FILE", "") or None,
            redelivery_min_ms=redelivery_min,
            redelivery_max_ms=env_int(
                env, "FATURA_REDELIVERY_MAX_MS", cls.redelivery_max_ms, lo=redelivery_min, hi=3_600_000
            ),
            unexpected_redeliveries=env_int(
                env, "FATURA_UNEXPECTED_REDELIVERIES", cls.unexpected_redeliveries, lo=0, hi=100
            ),
            reconcile_grace_seconds=env_float(
                env, "FATURA_RECONCILE_GRACE_SECONDS", cls.reconcile_grace_seconds, lo=0.5, hi=86_400
            ),
            reconcile_horizon_seconds=env_float(
                env, "FATURA_RECONCILE_HORIZON_SECONDS", cls.reconcile_horizon_seconds, lo=1, hi=30 * 86_400
            ),
            dead_letter_retention_days=env_float(
                env, "FATURA_DEAD_LETTER_RETENTION_DAYS", cls.dead_letter_retention_days, lo=0.01, hi=3650
            ),
            db_roles=db_roles in {"1", "true"},
        )
