"""The limiter's operations as pure values: validate a request, name the script with its keys and
arguments, and interpret the script's reply. A store (sync or asyncio) runs them; nothing here
does I/O, so every rule can be tested without Redis or gRPC.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from services.limiter.config import LimiterConfig, PoolLimits
from services.limiter.errors import (
    BackendError,
    InvalidArgument,
    NeverAdmittable,
    PermitNotFound,
    PermitNotHeld,
    RequestKeyConflict,
)
from services.limiter.ids import NAME, parse_permit_id, permit_id_for
from services.limiter.model import AcquireRequest, Denial, DenyReason, Dimension, Grant, Outcome, PoolStatus

T = TypeVar("T")
MAX_REQUEST_KEY = 200


@dataclass(frozen=True)
class ServerLimits:
    """Bounds on what one request may ask for (from ``LimiterSettings``)."""

    default_lease_ms: int = 60_000
    max_lease_ms: int = 300_000
    max_tokens: int = 2_000_000
    max_cooldown_ms: int = 3_600_000
    permit_retention_ms: int = 3_600_000
    in_flight_retry_cap_ms: int = 1_000
    # How long a request keeps its place in a local pool's KV line without asking again.
    kv_head_hold_ms: int = 2_000


@dataclass(frozen=True)
class Operation(Generic[T]):
    script: str  # name of services/limiter/lua/<script>.lua
    # As redis-py encodes them; Acquire and Release (the hot path) pass the bytes Redis receives.
    keys: Sequence[str | bytes]
    args: Sequence[str | int | bytes]
    interpret: Callable[[list[Any]], T]  # the decoded reply -> result, or a LimiterError


@dataclass(frozen=True)
class Released:
    # Nothing changed: an earlier Release had settled the permit, or (unless_handed_again) a
    # retried Acquire handed it to a caller that settles it itself.
    already_released: bool


@dataclass(frozen=True)
class Throttled:
    cooldown_until_ms: int
    extended: bool  # False when a longer cooldown was already in force


class KeyLayout:
    """Every key of a pool carries its hash tag ``{pool}``: one Redis Cluster slot per pool."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def _base(self, pool: str) -> str:
        return f"{self.prefix}:{{{pool}}}"

    def pool_keys(self, pool: str) -> list[str]:
        """inflight, window, wtokens, wsum, cooldown (the order every script expects)."""
        base = self._base(pool)
        return [f"{base}:inflight", f"{base}:window", f"{base}:wtokens", f"{base}:wsum", f"{base}:cooldown"]

    def tenant_inflight(self, pool: str, tenant: str) -> str:
        return f"{self._base(pool)}:tenant:{tenant}:inflight"

    def tenant_budget(self, pool: str, tenant: str) -> str:
        return f"{self._base(pool)}:tenant:{tenant}:budget"

    def kv_held(self, pool: str) -> str:
        """A local pool's in-flight context tokens: permit_id -> KV tokens held."""
        return f"{self._base(pool)}:kvheld"

    def kv_head(self, pool: str) -> str:
        """A local pool's line of requests turned away for KV tokens, whose oldest heads it:
        permit_id -> "joined_ms tokens last_ask_ms"."""
        return f"{self._base(pool)}:kvline"

    def pace(self, pool: str) -> str:
        """A paced pool's GCRA theoretical arrival times: {r: next request, t: next token} (ms)."""
        return f"{self._base(pool)}:pace"

    def permit(self, permit_id: str) -> str:
        pool, _, _ = parse_permit_id(permit_id)
        return self.permit_of(pool, permit_id)

    def permit_of(self, pool: str, permit_id: str) -> str:
        """``permit`` when the id's pool is known (the id already parsed or just built)."""
        return f"{self._base(pool)}:permit:{permit_id}"


class _Encoded:
    """What Acquire and Release send for one pool that no request changes (its keys, its limits,
    the server's limits), encoded once per configuration: redis-py encoding every str and int
    argument of every call again was a tenth of the limiter's instructions per Batch."""

    def __init__(self, keys: KeyLayout, name: str, pool: PoolLimits | None, limits: ServerLimits) -> None:
        self.pool_keys = tuple(key.encode() for key in keys.pool_keys(name))
        self.kv_keys = (keys.kv_held(name).encode(), keys.kv_head(name).encode(), keys.pace(name).encode())
        self.retention = b"%d" % limits.permit_retention_ms
        self.pool_limits: tuple[bytes, ...] = ()
        self.server_limits: tuple[bytes, ...] = ()
        self.pacing: tuple[bytes, ...] = ()
        # A pool dropped from the configuration since the grant is no longer paced.
        self.release_pace = (b"0", b"0")
        if pool is None:
            return
        self.pool_limits = tuple(b"%d" % v for v in (pool.rpm, pool.tpm, pool.max_in_flight, pool.window_ms))
        kv_capacity = -1 if pool.kv_token_capacity is None else pool.kv_token_capacity
        self.server_limits = (self.retention, b"%d" % limits.in_flight_retry_cap_ms, b"%d" % kv_capacity)
        self.pacing = (b"%d" % limits.kv_head_hold_ms, pool.pacing.encode(), b"%d" % pool.burst_ms)
        if pool.pacing == "gcra":
            intervals = (pool.request_interval_ms, pool.token_interval_ms)
            self.release_pace = (repr(intervals[0]).encode(), repr(intervals[1]).encode())


def _name(value: str, what: str) -> str:
    if not value:
        raise InvalidArgument(f"{what} must not be empty")
    if not NAME.match(value):
        raise InvalidArgument(f"{what} {value[:200]!r} must match {NAME.pattern}")
    return value


def _lease(lease_ms: int, limits: ServerLimits) -> int:
    if lease_ms < 0:
        raise InvalidArgument(f"lease_ms={lease_ms} must not be negative (0 means the default lease)")
    if lease_ms > limits.max_lease_ms:
        raise InvalidArgument(f"lease_ms={lease_ms} is over the maximum lease of {limits.max_lease_ms} ms")
    return lease_ms or limits.default_lease_ms


def _tokens(value: int, what: str, limits: ServerLimits) -> int:
    if value < 0:
        raise InvalidArgument(f"{what}={value} must not be negative")
    if value > limits.max_tokens:
        raise InvalidArgument(f"{what}={value} is over the maximum of {limits.max_tokens} tokens per call")
    return value


def _unexpected(script: str, reply: list[Any]) -> BackendError:
    return BackendError(f"{script}.lua replied {reply!r}")


class LimiterOps:
    """Builds operations against the current configuration (swapped on SIGHUP)."""

    def __init__(self, config: Callable[[], LimiterConfig], limits: ServerLimits, keys: KeyLayout) -> None:
        self._config = config
        self.limits = limits
        self.keys = keys
        # One attribute, read once per call: a reload swaps the configuration and its cache together.
        self._encoded: tuple[LimiterConfig | None, dict[str, _Encoded]] = (None, {})

    @property
    def config(self) -> LimiterConfig:
        return self._config()

    def _encoded_for(self, config: LimiterConfig, pool: str) -> _Encoded:
        built_for, cache = self._encoded
        if built_for is not config:
            cache = {}
            self._encoded = (config, cache)
        encoded = cache.get(pool)
        if encoded is None:
            encoded = _Encoded(self.keys, pool, config.pools.get(pool), self.limits)
            if pool in config.pools:  # a permit id may name any pool: only configured ones are kept
                cache[pool] = encoded
        return encoded

    def acquire(self, request: AcquireRequest, now_ms: int | None = None) -> Operation[Grant | Denial]:
        """``now_ms`` drives the script's clock (tests only); None: Redis's own TIME."""
        config = self._config()
        pool = config.pool(_name(request.pool, "pool"))
        _name(request.tenant, "tenant")
        if not request.request_key:
            raise InvalidArgument(
                "request_key must not be empty: it makes a retried Acquire return the same permit"
            )
        if len(request.request_key) > MAX_REQUEST_KEY:
            raise InvalidArgument(f"request_key is longer than {MAX_REQUEST_KEY} characters")
        _tokens(request.estimated_input_tokens, "estimated_input_tokens", self.limits)
        _tokens(request.max_output_tokens, "max_output_tokens", self.limits)
        reserved = request.reserved_tokens
        if reserved > self.limits.max_tokens:
            raise InvalidArgument(
                f"estimated input + max output = {reserved} tokens"
                f" is over the maximum of {self.limits.max_tokens}"
            )
        if reserved > pool.tpm:
            raise NeverAdmittable(
                f"a reservation of {reserved} tokens can never fit pool {pool.name!r}"
                f" (tpm {pool.tpm} per {pool.window_ms} ms)"
            )
        kv_tokens = pool.kv_tokens_for(reserved)
        if pool.kv_token_capacity is not None and kv_tokens > pool.kv_token_capacity:
            raise NeverAdmittable(
                f"a request holding {kv_tokens} context tokens can never fit local pool {pool.name!r}"
                f" (KV capacity {pool.kv_token_capacity} tokens)"
            )
        lease_ms = _lease(request.lease_ms, self.limits)
        policy = config.tenant(request.tenant)
        permit_id = permit_id_for(request.pool, request.tenant, request.request_key)

        def interpret(reply: list[Any]) -> Grant | Denial:
            kind = reply[0]
            if kind == "granted":
                return Grant(permit_id=reply[1], lease_expires_at_ms=int(reply[2]))
            if kind == "denied":
                return Denial(reason=DenyReason(reply[1]), retry_after_ms=int(reply[2]))
            if kind == "existing":
                if reply[3] == "held":
                    return Grant(permit_id=reply[1], lease_expires_at_ms=int(reply[2]))
                raise PermitNotHeld(
                    f"the permit for this request_key was already {reply[3]}: use a new request_key"
                )
            if kind == "conflict":
                raise RequestKeyConflict(
                    "request_key was already used with a different tenant or token figures"
                )
            raise _unexpected("acquire", reply)

        encoded = self._encoded_for(config, request.pool)
        return Operation(
            "acquire",
            [
                *encoded.pool_keys,
                self.keys.tenant_inflight(request.pool, request.tenant).encode(),
                self.keys.tenant_budget(request.pool, request.tenant).encode(),
                self.keys.permit_of(request.pool, permit_id).encode(),
                *encoded.kv_keys,
            ],
            [
                permit_id.encode(),
                b"%d" % reserved,
                b"%d" % lease_ms,
                *encoded.pool_limits,  # rpm, tpm, max_in_flight, window_ms
                b"-1" if policy.max_in_flight is None else b"%d" % policy.max_in_flight,
                b"-1" if policy.daily_token_budget is None else b"%d" % policy.daily_token_budget,
                f"{request.tenant}|{request.estimated_input_tokens}|{request.max_output_tokens}".encode(),
                *encoded.server_limits,  # permit retention, in-flight retry cap, KV capacity
                b"%d" % kv_tokens,
                *encoded.pacing,  # KV line hold, pacing, burst_ms
                b"" if now_ms is None else b"%d" % now_ms,
            ],
            interpret,
        )

    def renew(self, permit_id: str, lease_ms: int) -> Operation[int]:
        pool, tenant, _ = parse_permit_id(permit_id)
        lease = _lease(lease_ms, self.limits)

        def interpret(reply: list[Any]) -> int:
            if reply[0] == "renewed":
                return int(reply[1])
            if reply[0] == "not_found":
                raise PermitNotFound(f"no permit {permit_id!r}")
            if reply[0] in ("released", "expired"):
                raise PermitNotHeld(f"permit {permit_id!r} is {reply[0]} and cannot be renewed")
            raise _unexpected("renew", reply)

        inflight = self.keys.pool_keys(pool)[0]
        return Operation(
            "renew",
            [self.keys.permit(permit_id), inflight, self.keys.tenant_inflight(pool, tenant)],
            [permit_id, lease, self.limits.permit_retention_ms],
            interpret,
        )

    def release(
        self,
        permit_id: str,
        outcome: Outcome,
        input_tokens: int,
        output_tokens: int,
        *,
        unless_handed_again: bool = False,
    ) -> Operation[Released]:
        pool, tenant, _ = parse_permit_id(permit_id)
        _tokens(input_tokens, "input_tokens", self.limits)
        _tokens(output_tokens, "output_tokens", self.limits)

        def interpret(reply: list[Any]) -> Released:
            if reply[0] == "released":
                return Released(already_released=False)
            if reply[0] in ("already", "handed_again"):
                return Released(already_released=True)
            if reply[0] == "not_found":
                raise PermitNotFound(f"no permit {permit_id!r}")
            raise _unexpected("release", reply)

        encoded = self._encoded_for(self._config(), pool)
        inflight, window, wtokens, wsum, _ = encoded.pool_keys
        kv_held, _, pace = encoded.kv_keys
        return Operation(
            "release",
            [
                self.keys.permit_of(pool, permit_id).encode(),
                inflight,
                self.keys.tenant_inflight(pool, tenant).encode(),
                window,
                wtokens,
                wsum,
                self.keys.tenant_budget(pool, tenant).encode(),
                kv_held,
                pace,
            ],
            [
                permit_id.encode(),
                outcome.value.encode(),
                b"%d" % (input_tokens + output_tokens),
                encoded.retention,
                *encoded.release_pace,  # request and token intervals of a paced pool, else 0 and 0
                b"1" if unless_handed_again else b"0",
            ],
            interpret,
        )

    def report_throttle(self, pool: str, retry_after_ms: int) -> Operation[Throttled]:
        self._config().pool(_name(pool, "pool"))
        if retry_after_ms <= 0:
            raise InvalidArgument(f"retry_after_ms={retry_after_ms} must be positive")
        if retry_after_ms > self.limits.max_cooldown_ms:
            raise InvalidArgument(
                f"retry_after_ms={retry_after_ms}"
                f" is over the maximum cooldown of {self.limits.max_cooldown_ms} ms"
            )

        def interpret(reply: list[Any]) -> Throttled:
            return Throttled(cooldown_until_ms=int(reply[0]), extended=int(reply[1]) == 1)

        return Operation("throttle", [self.keys.pool_keys(pool)[4]], [retry_after_ms], interpret)

    def pool_status(self, pool_name: str) -> Operation[PoolStatus]:
        pool = self._config().pool(_name(pool_name, "pool"))

        def interpret(reply: list[Any]) -> PoolStatus:
            in_flight, requests, tokens, cooldown_until, now = (int(v) for v in reply)
            return PoolStatus(
                pool=pool.name,
                window_ms=pool.window_ms,
                requests=Dimension(pool.rpm, requests),
                tokens=Dimension(pool.tpm, tokens),
                in_flight=Dimension(pool.max_in_flight, in_flight),
                cooldown_until_ms=cooldown_until or None,
                observed_at_ms=now,
            )

        return Operation("status", self.keys.pool_keys(pool.name), [pool.window_ms], interpret)
