"""The simulator's own limits (RPM, TPM, concurrency) and the count of every request it received.

Both windows slide over the last 60 seconds of admitted requests, as a real provider's do; a
denial says which limit and how many whole seconds until it would pass (the ``Retry-After``).

With ``per_second`` the limits are also quantized per second, as OpenAI documents ("60,000
requests/minute may be enforced as 1,000 requests/second"): each is a bucket holding one second's
worth (RPM/60 requests, TPM/60 tokens) that refills continuously at that rate, the way a per-second
rate is enforced in practice. A burst of more than a second's worth, or a pace faster than RPM/60
a second, is refused however much of the minute is left. A request of more than a second's worth
of tokens passes only when the token bucket is full.
"""

from __future__ import annotations

import math
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

WINDOW_S = 60.0
SECOND_S = 1.0


@dataclass(frozen=True)
class Denial:
    limit: str  # "concurrency", "rpm", "tpm", or per second: "rpm_second", "tpm_second"
    retry_after_s: int
    message: str


class Limits:
    """Admission against the three limits; 0 means unlimited. Single-threaded (one event loop)."""

    def __init__(
        self,
        rpm: int,
        tpm: int,
        concurrency: int,
        clock: Callable[[], float] = time.monotonic,
        *,
        per_second: bool = False,
    ):
        self.rpm, self.tpm, self.concurrency = rpm, tpm, concurrency
        self.per_second = per_second
        self._clock = clock
        self._requests: deque[float] = deque()
        self._tokens: deque[tuple[float, int]] = deque()
        self._token_sum = 0
        # The per-second buckets as theoretical arrival times (GCRA): a bucket is full when its
        # time is not after now, and each admission moves it by what it took.
        self._request_tat = 0.0
        self._token_tat = 0.0
        self.in_flight = 0

    def admit(self, tokens: int) -> Denial | None:
        """Take a slot for a request of ``tokens``, or say why not. A denial takes nothing."""
        now = self._clock()
        self._expire(now)
        if self.concurrency and self.in_flight >= self.concurrency:
            return Denial(
                "concurrency", 1, f"Concurrency limit reached: {self.in_flight}/{self.concurrency}."
            )
        if self.rpm and len(self._requests) >= self.rpm:
            wait = self._requests[0] + WINDOW_S - now
            return Denial("rpm", _seconds(wait), f"Rate limit reached: {self.rpm} requests per minute.")
        if self.tpm and self._token_sum + tokens > self.tpm:
            if tokens > self.tpm:
                return Denial("tpm", 60, f"Request too large: {tokens} tokens, limit {self.tpm} per minute.")
            return Denial(
                "tpm", _seconds(self._tpm_wait(now, tokens)), f"Rate limit reached: {self.tpm} TPM."
            )
        if self.per_second:
            denial = self._second_denial(now, tokens)
            if denial is not None:
                return denial
            self._request_tat = max(self._request_tat, now) + (60 / self.rpm if self.rpm else 0.0)
            self._token_tat = max(self._token_tat, now) + (tokens * 60 / self.tpm if self.tpm else 0.0)
        self._requests.append(now)
        self._tokens.append((now, tokens))
        self._token_sum += tokens
        self.in_flight += 1
        return None

    def release(self) -> None:
        self.in_flight -= 1

    def _expire(self, now: float) -> None:
        while self._requests and self._requests[0] <= now - WINDOW_S:
            self._requests.popleft()
        while self._tokens and self._tokens[0][0] <= now - WINDOW_S:
            self._token_sum -= self._tokens.popleft()[1]

    def _second_denial(self, now: float, tokens: int) -> Denial | None:
        if self.rpm:
            # One request's room in the bucket: the bucket may be at most (1 s - interval) behind.
            interval = 60 / self.rpm
            ahead = max(self._request_tat, now) - now - max(0.0, SECOND_S - interval)
            if ahead > 1e-9:  # float sums of intervals must not refuse an exact fit
                return Denial(
                    "rpm_second",
                    _seconds(ahead),
                    f"Rate limit reached: {self.rpm} requests per minute, enforced as {self.rpm / 60:g}"
                    " requests per second.",
                )
        if self.tpm:
            cost = tokens * 60 / self.tpm
            ahead = max(self._token_tat, now) - now - max(0.0, SECOND_S - cost)
            if ahead > 1e-9:  # float sums of intervals must not refuse an exact fit
                return Denial(
                    "tpm_second",
                    _seconds(ahead),
                    f"Rate limit reached: {self.tpm} TPM, enforced as {self.tpm / 60:g} tokens per second.",
                )
        return None

    def _tpm_wait(self, now: float, tokens: int) -> float:
        need = self._token_sum + tokens - self.tpm
        for at, used in self._tokens:
            need -= used
            if need <= 0:
                return at + WINDOW_S - now
        return WINDOW_S

    def usage(self) -> dict[str, int]:
        self._expire(self._clock())
        return {"requests_in_window": len(self._requests), "tokens_in_window": self._token_sum}


def _seconds(wait: float) -> int:
    return max(1, math.ceil(wait))


class Stats:
    """Every request by outcome, tokens, peak concurrency; also as Prometheus metrics."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.outcomes: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.peak_in_flight = 0
        self._requests = PromCounter(
            "fatura_sandbox_provider_requests",
            "Chat completion requests received, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._tokens = PromCounter(
            "fatura_sandbox_provider_tokens", "Tokens answered, by kind", ["kind"], registry=self.registry
        )
        self._in_flight = Gauge(
            "fatura_sandbox_provider_in_flight", "Requests in progress", registry=self.registry
        )
        self._peak = Gauge(
            "fatura_sandbox_provider_peak_in_flight",
            "Most requests in progress at once since start or the last stats reset",
            registry=self.registry,
        )

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] += 1
        self._requests.labels(outcome).inc()

    def usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.tokens["prompt"] += prompt_tokens
        self.tokens["completion"] += completion_tokens
        self._tokens.labels("prompt").inc(prompt_tokens)
        self._tokens.labels("completion").inc(completion_tokens)

    def in_flight(self, value: int) -> None:
        self._in_flight.set(value)
        if value > self.peak_in_flight:
            self.peak_in_flight = value
            self._peak.set(value)

    def reset(self, in_flight: int) -> None:
        """Forget the counts (Prometheus counters keep counting, as counters must)."""
        self.outcomes.clear()
        self.tokens.clear()
        self.peak_in_flight = in_flight
        self._peak.set(in_flight)

    def snapshot(self) -> dict[str, Any]:
        return {
            "requests_total": sum(self.outcomes.values()),
            "by_outcome": dict(sorted(self.outcomes.items())),
            "peak_in_flight": self.peak_in_flight,
            "tokens": {"prompt": self.tokens["prompt"], "completion": self.tokens["completion"]},
        }
