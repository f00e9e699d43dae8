"""The client's local emergency quota: bounded permits used only while the limiter cannot be reached.

Each process may hold at most ``share`` of a pool's in-flight slots and use at most ``share`` of its
requests and tokens per window. Share 0 (the default) means closed: no call without the limiter.
Pure accounting under a lock, with an injectable clock; nothing here talks to the network.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from services.limiter.config import LimiterConfig, PoolLimits
from services.limiter.model import Denial, DenyReason, Grant, Outcome

PREFIX = "!emergency/"
"""Emergency permit ids start with this; no limiter permit id can (pool names cannot start with '!')."""


def is_emergency(permit_id: str) -> bool:
    return permit_id.startswith(PREFIX)


def _wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class EmergencyLimits:
    max_in_flight: int
    requests_per_window: int
    tokens_per_window: int
    window_ms: int

    @classmethod
    def share_of(cls, pool: PoolLimits, share: float) -> EmergencyLimits:
        return cls(
            max_in_flight=math.floor(pool.max_in_flight * share),
            requests_per_window=math.floor(pool.rpm * share),
            tokens_per_window=math.floor(pool.tpm * share),
            window_ms=pool.window_ms,
        )

    @property
    def closed(self) -> bool:
        return self.max_in_flight < 1 or self.requests_per_window < 1


@dataclass
class _PoolState:
    limits: EmergencyLimits
    leases: dict[str, int] = field(default_factory=dict)  # permit_id -> lease expiry (ms)
    window: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # permit_id -> (granted ms, tokens), oldest first
    cooldown_until_ms: int = 0

    def sweep(self, now: int) -> None:
        for permit_id in [p for p, expires in self.leases.items() if expires <= now]:
            del self.leases[permit_id]
        cutoff = now - self.limits.window_ms
        while self.window:
            permit_id, (granted, _) = next(iter(self.window.items()))
            if granted > cutoff:
                break
            del self.window[permit_id]


class EmergencyQuota:
    def __init__(
        self,
        limits: Mapping[str, EmergencyLimits],
        *,
        clock: Callable[[], int] = _wall_ms,
        retry_ms: int = 1_000,
    ) -> None:
        self._pools = {name: _PoolState(pool_limits) for name, pool_limits in limits.items()}
        self._clock = clock
        self._retry_ms = retry_ms
        self._lock = threading.Lock()

    @classmethod
    def from_config(
        cls,
        config: LimiterConfig,
        share: float,
        *,
        clock: Callable[[], int] = _wall_ms,
        retry_ms: int = 1_000,
    ) -> EmergencyQuota:
        limits = {name: EmergencyLimits.share_of(pool, share) for name, pool in config.pools.items()}
        return cls(limits, clock=clock, retry_ms=retry_ms)

    def limits(self, pool: str) -> EmergencyLimits | None:
        state = self._pools.get(pool)
        return None if state is None else state.limits

    def held(self, pool: str) -> int:
        with self._lock:
            state = self._pools.get(pool)
            if state is None:
                return 0
            state.sweep(self._clock())
            return len(state.leases)

    def try_acquire(self, pool: str, tokens: int, lease_ms: int) -> Grant | Denial:
        """A local permit if the pool's share has room, else a Denial with reason UNAVAILABLE."""
        with self._lock:
            state = self._pools.get(pool)
            if state is None or state.limits.closed:
                return Denial(DenyReason.UNAVAILABLE, self._retry_ms)
            now = self._clock()
            state.sweep(now)
            waits: list[int] = []
            if state.cooldown_until_ms > now:
                waits.append(state.cooldown_until_ms - now)
            if len(state.leases) >= state.limits.max_in_flight:
                waits.append(min(min(state.leases.values()) - now, self._retry_ms))
            if len(state.window) >= state.limits.requests_per_window:
                oldest = next(iter(state.window.values()))[0]
                waits.append(oldest + state.limits.window_ms - now)
            if sum(t for _, t in state.window.values()) + tokens > state.limits.tokens_per_window:
                waits.append(
                    next(iter(state.window.values()))[0] + state.limits.window_ms - now
                    if state.window
                    else self._retry_ms
                )
            if waits:
                return Denial(DenyReason.UNAVAILABLE, max(1, max(waits)))
            permit_id = f"{PREFIX}{pool}/{uuid.uuid4().hex}"
            state.leases[permit_id] = now + lease_ms
            state.window[permit_id] = (now, tokens)
            return Grant(permit_id=permit_id, lease_expires_at_ms=now + lease_ms, emergency=True)

    def _state_of(self, permit_id: str) -> _PoolState | None:
        pool = permit_id.removeprefix(PREFIX).rpartition("/")[0]
        return self._pools.get(pool)

    def renew(self, permit_id: str, lease_ms: int) -> int | None:
        """The new expiry, or None when the local lease is gone (released or expired)."""
        with self._lock:
            state = self._state_of(permit_id)
            now = self._clock()
            if state is None or state.leases.get(permit_id, 0) <= now:
                return None
            state.leases[permit_id] = now + lease_ms
            return now + lease_ms

    def release(self, permit_id: str, outcome: Outcome, used_tokens: int) -> bool:
        """Free the local slot and correct the local window like the limiter does.

        False when the permit is not held here (unknown, already released, or its lease expired:
        then its reservation simply stays in the window until it ages out)."""
        with self._lock:
            state = self._state_of(permit_id)
            if state is None or state.leases.pop(permit_id, None) is None:
                return False
            entry = state.window.get(permit_id)
            if entry is not None:
                if outcome is Outcome.NOT_SENT:
                    del state.window[permit_id]
                elif outcome is Outcome.COMPLETED:
                    state.window[permit_id] = (entry[0], used_tokens)
            return True

    def note_throttle(self, pool: str, retry_after_ms: int) -> None:
        """A provider 429 seen by this process also pauses its emergency permits for that pool."""
        with self._lock:
            state = self._pools.get(pool)
            if state is not None:
                state.cooldown_until_ms = max(state.cooldown_until_ms, self._clock() + retry_after_ms)
