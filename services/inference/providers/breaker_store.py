"""Where the circuit breakers live: in Redis, one small Lua script per decision, keyed per channel.

Why shared and not per process: a channel's health is a property of the upstream, not of the
worker or host that noticed it. With per-process state (the seed's choice) each of N worker
processes on M hosts must pay three failed round trips of its own before it stops calling a broken
channel, N x M x 3 wasted calls and timeouts; in Redis the third failure anywhere in the pool opens the
channel for every worker on every host. Redis is already the limiter's shared store, the script
makes each read-modify-write atomic, and both keys of a channel share one hash tag, so it is Redis
Cluster-safe. The clock is Redis's (``TIME``), so hosts with skewed clocks agree.

A channel with no failure in its window is remembered as healthy by each process for
``healthy_cache_ms`` (default 1 s), which saves a Redis round trip on nearly every call. The cost: a
process that found a channel spotless may send to it for up to that long after other processes
opened it; a channel with any recent failure is asked about on every call, and a failure this
process sees forgets the cached answer at once.

If Redis cannot be reached the breaker fails open (every channel is tried): it only saves wasted
calls, while the limiter, which fails closed, still guards the provider.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import redis

from services.common import redis_pool
from services.inference.providers.breaker import Admission, Report, Verdict
from services.inference.providers.settings import BreakerPolicy

log = logging.getLogger(__name__)
SCRIPT = (Path(__file__).resolve().parent / "lua" / "breaker.lua").read_text(encoding="utf-8")
_VERDICTS = {0: Verdict.CLOSED, 1: Verdict.TRIAL, 2: Verdict.OPEN}
_CLOSED = Admission(Verdict.CLOSED)  # frozen: one instance serves every call that needs no script
_WARN_EVERY_S = 10.0


def connect(url: str, *, timeout_s: float = 0.1, max_connections: int = 64) -> redis.Redis:
    # A slow Redis must not slow every provider call: the breaker then fails open.
    return redis_pool.connect(url, timeout_s=timeout_s, max_connections=max_connections)


class RedisBreakers:
    """Every channel's breaker; thread-safe (redis-py's pool), shared by all worker processes."""

    def __init__(
        self, client: redis.Redis, prefix: str, policy: BreakerPolicy, *, healthy_cache_ms: int = 0
    ) -> None:
        self._client = client
        self._prefix = prefix
        self.policy = policy
        self._healthy_cache_s = healthy_cache_ms / 1000
        self._healthy_until: dict[str, float] = {}  # channel -> monotonic time; GIL-atomic updates
        self._script = client.register_script(SCRIPT)
        self._lock = threading.Lock()
        self._last_warning = 0.0

    def keys(self, channel: str) -> list[str]:
        tag = "{" + channel + "}"  # one hash tag per channel: both keys land on one cluster slot
        return [f"{self._prefix}:{tag}:state", f"{self._prefix}:{tag}:failures"]

    def admit(self, channel: str, *, now_ms: int | None = None) -> Admission:
        if now_ms is None and self._healthy_until.get(channel, 0.0) > time.monotonic():
            return _CLOSED
        reply = self._run(channel, "admit", False, now_ms)
        if reply is None:
            return _CLOSED
        verdict = _VERDICTS[int(reply[0])]
        if verdict is Verdict.CLOSED and int(reply[2]) == 0 and self._healthy_cache_s > 0:
            self._healthy_until[channel] = time.monotonic() + self._healthy_cache_s
        return Admission(verdict, int(reply[1]))

    def report(self, channel: str, outcome: Report, *, trial: bool, now_ms: int | None = None) -> Verdict:
        """Record a hop's outcome; returns whether the channel is open afterwards."""
        if outcome is not Report.FAILURE and not trial:
            return Verdict.CLOSED  # nothing to write: a success outside a trial changes no state
        self._healthy_until.pop(channel, None)
        reply = self._run(channel, outcome.value, trial, now_ms)
        return Verdict.CLOSED if reply is None else _VERDICTS[int(reply[0])]

    def failures(self, channel: str, *, now_ms: int | None = None) -> int:
        """Failures in the window now (for tests and operators)."""
        reply = self._run(channel, "peek", False, now_ms)
        return 0 if reply is None else int(reply[2])

    def reset(self, channel: str) -> None:
        self._client.delete(*self.keys(channel))

    def _run(self, channel: str, op: str, trial: bool, now_ms: int | None) -> list[int] | None:
        p = self.policy
        args: list[str | int] = [
            op,
            p.failures,
            p.window_ms,
            p.cooldown_ms,
            p.trial_ms,
            "1" if trial else "0",
        ]
        if now_ms is not None:
            args.append(now_ms)
        try:
            reply = self._script(keys=self.keys(channel), args=args)
        except redis.exceptions.RedisError as exc:
            self._warn(channel, exc)
            return None
        return [int(x) for x in reply]

    def _warn(self, channel: str, exc: Exception) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last_warning < _WARN_EVERY_S:
                return
            self._last_warning = now
        log.warning("circuit breaker store unreachable, treating %s as closed: %s", channel, exc)
