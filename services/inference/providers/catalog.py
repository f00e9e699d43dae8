"""Channels and routing chains: which endpoints may serve a model, cheapest first (seed 001, layer 2).

Loaded once from the TOML file ``FATURA_PROVIDER_CONFIG`` names, or built from
``FATURA_PROVIDER_BASE_URL`` alone. A chain holds at most three channels and every one of them serves
the same model: failover moves a request between channels, never to another model. A bad file stops
the process at start with the reason (``CatalogError`` is a ``SettingsError``).
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.settings import SettingsError
from services.inference.providers.settings import GatewaySettings

ROUTING_CHAIN_MAX = 3
_CHANNEL_KEYS = {"serves", "base_url", "upstream_model", "api_key_env", "cost", "pool"}


class CatalogError(SettingsError):
    """The provider configuration cannot be used."""


@dataclass(frozen=True)
class Channel:
    name: str
    serves: str  # the catalog model this channel serves
    base_url: str  # up to and including /v1
    upstream_model: str  # what this endpoint calls that model
    cost: float  # relative price, only used to check the chain's order
    pool: str  # the limiter pool (account + model) this channel's calls count against
    api_key: str | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"


@dataclass(frozen=True)
class Catalog:
    chains: Mapping[str, tuple[Channel, ...]]
    default_model: str

    def chain(self, model: str) -> tuple[Channel, ...] | None:
        return self.chains.get(model)

    @property
    def channels(self) -> tuple[Channel, ...]:
        seen: dict[str, Channel] = {}
        for chain in self.chains.values():
            for channel in chain:
                seen.setdefault(channel.name, channel)
        return tuple(seen.values())


def load_catalog(settings: GatewaySettings, env: Mapping[str, str] | None = None) -> Catalog:
    env = os.environ if env is None else env
    if settings.override is not None:
        o = settings.override
        channel = Channel("default", o.model, o.base_url, o.model, 0.0, o.pool, o.api_key)
        return Catalog({o.model: (channel,)}, o.model)
    try:
        raw = tomllib.loads(Path(settings.config_path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise CatalogError(f"FATURA_PROVIDER_CONFIG={settings.config_path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"FATURA_PROVIDER_CONFIG={settings.config_path}: {exc}") from None
    catalog = parse_catalog(raw, env)
    if settings.default_model is not None:
        if catalog.chain(settings.default_model) is None:
            raise CatalogError(f"FATURA_PROVIDER_MODEL={settings.default_model!r} has no chain in the file")
        catalog = Catalog(catalog.chains, settings.default_model)
    return catalog


def parse_catalog(raw: Mapping[str, Any], env: Mapping[str, str]) -> Catalog:
    channels = {name: _channel(name, spec, env) for name, spec in _table(raw, "channels").items()}
    chains: dict[str, tuple[Channel, ...]] = {}
    for model, spec in _table(raw, "models").items():
        if not isinstance(spec, Mapping) or set(spec) != {"chain"} or not isinstance(spec["chain"], list):
            raise CatalogError(f"models.{model}: needs exactly `chain = [channel names]`")
        chains[model] = _chain(model, spec["chain"], channels)
    if not chains:
        raise CatalogError("the provider configuration names no model")
    default = raw.get("default_model", next(iter(chains)))
    if default not in chains:
        raise CatalogError(f"default_model={default!r} has no chain")
    return Catalog(chains, str(default))


def _table(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, Mapping):
        raise CatalogError(f"`{key}` must be a table")
    return value


def _chain(model: str, names: list[Any], channels: Mapping[str, Channel]) -> tuple[Channel, ...]:
    if not 1 <= len(names) <= ROUTING_CHAIN_MAX:
        raise CatalogError(
            f"models.{model}: a chain holds 1 to {ROUTING_CHAIN_MAX} channels, not {len(names)}"
        )
    if len(set(names)) != len(names):
        raise CatalogError(f"models.{model}: a channel appears twice in the chain")
    chain = []
    for name in names:
        channel = channels.get(name)
        if channel is None:
            raise CatalogError(f"models.{model}: unknown channel {name!r}")
        if channel.serves != model:
            # Failover must never answer with another model than the one asked for.
            raise CatalogError(f"models.{model}: channel {name!r} serves {channel.serves!r}, not {model!r}")
        chain.append(channel)
    costs = [c.cost for c in chain]
    if costs != sorted(costs):
        raise CatalogError(f"models.{model}: the chain must be cheapest first (costs {costs})")
    return tuple(chain)


def _channel(name: str, spec: Any, env: Mapping[str, str]) -> Channel:
    where = f"channels.{name}"
    if not isinstance(spec, Mapping):
        raise CatalogError(f"{where} must be a table")
    unknown = set(spec) - _CHANNEL_KEYS
    if unknown:
        raise CatalogError(
            f"{where}: unknown keys {sorted(unknown)} (the key itself never goes in this file)"
        )
    for key in ("serves", "base_url", "pool"):
        if not isinstance(spec.get(key), str) or not spec[key].strip():
            raise CatalogError(f"{where}.{key} must be a non-empty string")
    base_url = str(spec["base_url"]).rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise CatalogError(f"{where}.base_url={base_url!r} is not an http(s) URL")
    cost = spec.get("cost", 0.0)
    if isinstance(cost, bool) or not isinstance(cost, int | float) or cost < 0:
        raise CatalogError(f"{where}.cost must be a number >= 0")
    api_key = None
    key_env = spec.get("api_key_env")
    if key_env is not None:
        if not isinstance(key_env, str) or not key_env:
            raise CatalogError(f"{where}.api_key_env must name an environment variable")
        api_key = env.get(key_env, "").strip()
        if not api_key:
            raise CatalogError(f"{where}: the environment variable {key_env} holding its API key is not set")
    upstream = spec.get("upstream_model", spec["serves"])
    if not isinstance(upstream, str) or not upstream:
        raise CatalogError(f"{where}.upstream_model must be a non-empty string")
    return Channel(name, spec["serves"], base_url, upstream, float(cost), spec["pool"], api_key)
