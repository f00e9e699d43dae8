"""Settings read once from ``FATURA_*`` environment variables; a bad value fails fast with its name."""

from __future__ import annotations

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


@dataclass(frozen=True)
class CommonSettings:
    """Connections and switches every process needs."""

    database_url: str = "postgresql://postgres@127.0.0.1:5432/fatura"
    amqp_url: str = "amqp://guest:guest@127.0.0.1:5672/%2F"
    redis_url: str = "redis://127.0.0.1:6379/0"
    queue_prefix: str = "fatura"
    db_pool_min: int = 1
    db_pool_max: int = 10
    faults: frozenset[str] = field(default_factory=frozenset)
    log_level: str = "INFO"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> CommonSettings:
        env = os.environ if env is None else env
        prefix = env_str(env, "FATURA_QUEUE_PREFIX", cls.queue_prefix)
        if not prefix.replace("_", "").replace("-", "").isalnum():
            raise SettingsError(f"FATURA_QUEUE_PREFIX={prefix!r} may hold only letters, digits, '-' and '_'")
        level = env_str(env, "FATURA_LOG_LEVEL", cls.log_level).upper()
        if level not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise SettingsError(f"FATURA_LOG_LEVEL={level!r} is not one of DEBUG, INFO, WARNING, ERROR")
        pool_min = env_int(env, "FATURA_DB_POOL_MIN", cls.db_pool_min, lo=0, hi=200)
        return cls(
            database_url=env_str(env, "FATURA_DATABASE_URL", cls.database_url),
            amqp_url=env_str(env, "FATURA_AMQP_URL", cls.amqp_url),
            redis_url=env_str(env, "FATURA_REDIS_URL", cls.redis_url),
            queue_prefix=prefix,
            db_pool_min=pool_min,
            db_pool_max=env_int(env, "FATURA_DB_POOL_MAX", cls.db_pool_max, lo=max(1, pool_min), hi=200),
            faults=env_set(env, "FATURA_FAULTS"),
            log_level=level,
        )
