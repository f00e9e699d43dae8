"""Pool limits and tenant policies, parsed from the TOML file named by ``FATURA_LIMITER_CONFIG``.

Parsing is a pure function (``parse_config``); ``ConfigHolder`` swaps in a new immutable
``LimiterConfig`` on reload (SIGHUP) and keeps the old one when the new file is bad.

Tenant caps and budgets apply inside one pool: every key a pool uses shares that pool's Redis
hash tag, which keeps each Acquire a single-slot script on Redis Cluster.
"""

from __future__ import annotations

import logging
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.limiter.errors import UnknownPool
from services.limiter.ids import NAME

log = logging.getLogger(__name__)

_MAX_LIMIT = 10**12


class ConfigError(ValueError):
    """The limiter configuration file is unreadable or invalid; the message names the file and key."""


@dataclass(frozen=True)
class PoolLimits:
    name: str
    rpm: int  # requests per window
    tpm: int  # tokens per window
    max_in_flight: int  # leases held at once, across every process
    window_ms: int = 60_000  # RPM/TPM sliding window; 60 s makes them per-minute figures
    # ``local``: a self-hosted server (vLLM) whose limit is GPU memory, not a quota.
    kind: str = "hosted"
    # Local pools: context tokens (prompt + max output) held by in-flight requests at once, i.e.
    # the server's KV cache; None: no such dimension. A reservation is rounded up to whole blocks.
    kv_token_capacity: int | None = None
    block_size: int = 1
    # ``gcra``: requests and tokens are also paced (acquire.lua), one request every window_ms/rpm
    # ms, so a provider that quantizes its limits per second sees no burst; ``window``: the
    # window's caps alone, which a pool may spend at once. Default: gcra hosted, window local.
    pacing: str = "gcra"
    # How far the paces may run ahead of the clock, as a share of a second's worth of requests
    # (0 to 1); at least one request always goes. 0: evenly spaced, which loses every moment a
    # claim comes late to its turn; half a second catches up on that and leaves the other half of
    # a provider's one-second bucket for send-delay variation (docs/benchmarks.md, bench quota).
    burst_seconds: float = 0.5

    @property
    def burst_ms(self) -> int:
        return round(self.burst_seconds * 1000)

    @property
    def request_interval_ms(self) -> float:
        """The pace of requests: the window's requests spread evenly over it."""
        return self.window_ms / self.rpm

    @property
    def token_interval_ms(self) -> float:
        return self.window_ms / self.tpm

    def kv_tokens_for(self, reserved: int) -> int:
        """The KV cache a reservation holds: whole blocks, as a paged-attention server allocates."""
        return -(-reserved // self.block_size) * self.block_size


@dataclass(frozen=True)
class TenantPolicy:
    max_in_flight: int | None = None  # None: only the pool's cap applies
    daily_token_budget: int | None = None  # tokens per UTC day (Redis clock); None: no budget


@dataclass(frozen=True)
class LimiterConfig:
    pools: Mapping[str, PoolLimits]
    tenant_defaults: TenantPolicy = TenantPolicy()
    tenants: Mapping[str, TenantPolicy] = field(default_factory=dict)
    source: str = "<memory>"

    def pool(self, name: str) -> PoolLimits:
        try:
            return self.pools[name]
        except KeyError:
            raise UnknownPool(f"unknown pool {name!r}; configured pools: {sorted(self.pools)}") from None

    def tenant(self, name: str) -> TenantPolicy:
        return self.tenants.get(name, self.tenant_defaults)


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table")
    return value


def _int(table: dict[str, Any], key: str, where: str, *, lo: int, required: bool) -> int | None:
    if key not in table:
        if required:
            raise ConfigError(f"{where}.{key} is required")
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}.{key} must be an integer, not {value!r}")
    if not lo <= value <= _MAX_LIMIT:
        raise ConfigError(f"{where}.{key}={value} is outside [{lo}, {_MAX_LIMIT}]")
    return value


def _no_unknown_keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _pool(name: str, raw: Any) -> PoolLimits:
    where = f"pools.{name}"
    if not NAME.match(name):
        raise ConfigError(f"{where}: pool names must match {NAME.pattern}")
    table = _table(raw, where)
    _no_unknown_keys(
        table,
        {
            "rpm",
            "tpm",
            "max_in_flight",
            "window_ms",
            "kind",
            "kv_token_capacity",
            "kv_blocks",
            "block_size",
            "pacing",
            "burst_seconds",
        },
        where,
    )
    window = _int(table, "window_ms", where, lo=100, required=False)
    kind = table.get("kind", "hosted")
    if kind not in ("hosted", "local"):
        raise ConfigError(f"{where}.kind must be 'hosted' or 'local', not {kind!r}")
    capacity = _int(table, "kv_token_capacity", where, lo=1, required=False)
    blocks = _int(table, "kv_blocks", where, lo=1, required=False)
    block_size = _int(table, "block_size", where, lo=1, required=False)
    if kind == "hosted" and (capacity or blocks or block_size):
        raise ConfigError(f"{where}: kv_token_capacity, kv_blocks and block_size need kind = 'local'")
    if kind == "local":
        if (capacity is None) == (blocks is None):
            raise ConfigError(f"{where}: a local pool sets kv_token_capacity or kv_blocks (not both)")
        if blocks is not None:
            if block_size is None:
                raise ConfigError(f"{where}: kv_blocks needs block_size (tokens per KV block)")
            capacity = blocks * block_size
    pacing = table.get("pacing", "gcra" if kind == "hosted" else "window")
    if pacing not in ("gcra", "window"):
        raise ConfigError(f"{where}.pacing must be 'gcra' or 'window', not {pacing!r}")
    burst = table.get("burst_seconds", PoolLimits.burst_seconds if pacing == "gcra" else 0.0)
    if isinstance(burst, bool) or not isinstance(burst, int | float) or not 0 <= burst <= 1:
        raise ConfigError(f"{where}.burst_seconds must be a number from 0 to 1, not {burst!r}")
    if "burst_seconds" in table and pacing != "gcra":
        raise ConfigError(f"{where}: burst_seconds needs pacing = 'gcra'")
    return PoolLimits(
        name=name,
        rpm=_int(table, "rpm", where, lo=1, required=True) or 0,
        tpm=_int(table, "tpm", where, lo=1, required=True) or 0,
        max_in_flight=_int(table, "max_in_flight", where, lo=1, required=True) or 0,
        window_ms=60_000 if window is None else window,
        kind=kind,
        kv_token_capacity=capacity,
        block_size=block_size or 1,
        pacing=pacing,
        burst_seconds=float(burst),
    )


def _tenant(raw: Any, where: str) -> TenantPolicy:
    table = _table(raw, where)
    _no_unknown_keys(table, {"max_in_flight", "daily_token_budget"}, where)
    return TenantPolicy(
        max_in_flight=_int(table, "max_in_flight", where, lo=1, required=False),
        daily_token_budget=_int(table, "daily_token_budget", where, lo=0, required=False),
    )


def parse_config(text: str, source: str = "<memory>") -> LimiterConfig:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    try:
        _no_unknown_keys(doc, {"pools", "tenant_defaults", "tenants"}, "top level")
        pools = {name: _pool(name, raw) for name, raw in _table(doc.get("pools", {}), "pools").items()}
        if not pools:
            raise ConfigError("pools: at least one pool is required")
        defaults = _tenant(doc.get("tenant_defaults", {}), "tenant_defaults")
        tenants: dict[str, TenantPolicy] = {}
        for name, raw in _table(doc.get("tenants", {}), "tenants").items():
            if not NAME.match(name):
                raise ConfigError(f"tenants.{name}: tenant names must match {NAME.pattern}")
            tenants[name] = _tenant(raw, f"tenants.{name}")
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return LimiterConfig(pools=pools, tenant_defaults=defaults, tenants=tenants, source=source)


def load_config(path: Path) -> LimiterConfig:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return parse_config(text, str(path))


class ConfigHolder:
    """The current configuration; ``reload()`` replaces it atomically or keeps it if the file is bad."""

    def __init__(self, path: Path, initial: LimiterConfig | None = None) -> None:
        self._path = path
        self._lock = threading.Lock()
        self._current = initial if initial is not None else load_config(path)

    @property
    def current(self) -> LimiterConfig:
        return self._current

    def reload(self) -> bool:
        with self._lock:
            try:
                fresh = load_config(self._path)
            except ConfigError as exc:
                log.error("limiter config reload failed, keeping the previous one: %s", exc)
                return False
            self._current = fresh
        log.info("limiter config reloaded from %s: pools %s", self._path, sorted(fresh.pools))
        return True
