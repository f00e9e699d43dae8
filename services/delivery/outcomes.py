"""What one delivery attempt means (DESIGN §5.9): delivered, retry later, fail, or disable the endpoint.

Pure functions: the retry schedule, ``Retry-After`` parsing, and the classification of an attempt
into the change it makes to the delivery and to its endpoint's health.
"""

from __future__ import annotations

import enum
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# Standard Webhooks' schedule: the delay after the 1st, 2nd, ... failed attempt. After the last
# one the delivery is dead (10 attempts over about 3.5 days).
RETRY_DELAYS_SECONDS: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
MAX_ATTEMPTS = len(RETRY_DELAYS_SECONDS) + 1
JITTER = 0.2  # each delay is drawn from [1 - JITTER, 1 + JITTER] of its nominal value
MAX_RETRY_AFTER_SECONDS = 86400.0
_DELTA_SECONDS = re.compile(r"[0-9]+")  # RFC 9110 DIGIT is ASCII; str.isdigit() also takes "٣٠" and "²"


class Kind(enum.StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"  # transient: 429, 5xx, 408, timeout, connection error
    FAILED = "failed"  # permanent for this delivery: other 4xx, 3xx, a refused target
    GONE = "gone"  # 410: the receiver says the endpoint is gone for good
    AUTH = "auth"  # 401/403: retried, counted; repeated ones disable the endpoint


@dataclass(frozen=True)
class AttemptResult:
    """What the sender saw: an HTTP status, or an error class when no status arrived.

    ``response_body`` is always storable text: whatever a receiver sent, NUL (which PostgreSQL's
    text refuses) and lone surrogates (which UTF-8 cannot encode) become U+FFFD.
    """

    status: int | None
    error_class: str | None = None
    retry_after_seconds: float | None = None
    response_body: str | None = None
    latency_ms: int = 0
    # True when the target itself was refused (egress guard): retrying cannot help.
    refused: bool = False

    def __post_init__(self) -> None:
        if self.response_body is not None:
            object.__setattr__(self, "response_body", storable_text(self.response_body))


def storable_text(text: str) -> str:
    """``text`` with what a PostgreSQL text column or a UTF-8 encoder refuses replaced by U+FFFD."""
    if text.isascii() and "\x00" not in text:
        return text
    encodable = text.encode("utf-8", errors="surrogatepass").decode("utf-8", errors="replace")
    return encodable.replace("\x00", "\ufffd")


def classify(result: AttemptResult) -> tuple[Kind, str]:
    """The kind of outcome and a short reason an operator can read."""
    status = result.status
    if status is None:
        if result.refused:
            name = result.error_class or "egress_refused"
            return Kind.FAILED, f"{name}: the registered URL cannot be sent to"
        return Kind.RETRY, result.error_class or "transport_error"
    if 200 <= status < 300:
        return Kind.DELIVERED, f"http_{status}"
    if 300 <= status < 400:
        return Kind.FAILED, f"http_{status}: redirects are not followed"
    if status == 410:
        return Kind.GONE, "http_410: the receiver says the endpoint is gone"
    if status in (401, 403):
        return Kind.AUTH, f"http_{status}: the receiver refused the signature or the sender"
    if status in (408, 429) or status >= 500:
        return Kind.RETRY, f"http_{status}"
    if 400 <= status < 500:
        return Kind.FAILED, f"http_{status}"
    return Kind.RETRY, f"http_{status}: unexpected status"


def retry_delay(
    attempt: int,
    *,
    scale: float = 1.0,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds until the next attempt after failed attempt number ``attempt`` (1-based); None: no more.

    The nominal delay is scaled (tests shorten the schedule) and jittered; a receiver's
    ``Retry-After`` is a floor, never scaled, capped at a day.
    """
    if attempt < 1 or attempt > len(RETRY_DELAYS_SECONDS):
        return None
    draw = (rng or random).uniform(1 - JITTER, 1 + JITTER)
    delay = RETRY_DELAYS_SECONDS[attempt - 1] * scale * draw
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_SECONDS))
    return delay


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds or as an HTTP-date, as seconds from now; None when absent or bad.

    Only what RFC 9110 allows counts: ASCII delta-seconds or an HTTP-date. Anything else (other
    scripts' digits, a sign, a fraction, an exponent, a date no calendar holds) is ignored and the
    normal schedule applies. A date in the past means now; every answer is capped at a day.
    """
    if value is None:
        return None
    value = value.strip()
    if not value or not value.isascii():
        return None
    if _DELTA_SECONDS.fullmatch(value):
        # float() of a thousand digits is inf, not an error; the cap applies either way.
        return min(float(value), MAX_RETRY_AFTER_SECONDS)
    try:
        when = parsedate_to_datetime(value)
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        seconds = (when - (now or datetime.now(UTC))).total_seconds()
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


def retry_after(values: Iterable[str], now: datetime | None = None) -> float | None:
    """The wait several ``Retry-After`` fields ask for: the longest valid one (each is a floor)."""
    waits = [w for w in (parse_retry_after(v, now) for v in values) if w is not None]
    return max(waits) if waits else None


@dataclass(frozen=True)
class Decision:
    """The delivery's next state and what the attempt does to its endpoint's health."""

    state: str  # delivered, pending (retry), failed, dead
    reason: str
    delay_seconds: float | None = None
    disable_endpoint: str | None = None  # a reason, when this attempt alone disables it
    breaker_failure: bool = False  # counts toward opening the circuit breaker
    auth_failure: bool = False  # counts toward the repeated-401/403 alarm
    healthy: bool = False  # resets both counters


def decide(
    result: AttemptResult, attempt: int, *, scale: float = 1.0, rng: random.Random | None = None
) -> Decision:
    kind, reason = classify(result)
    if kind is Kind.DELIVERED:
        return Decision("delivered", reason, healthy=True)
    if kind is Kind.GONE:
        return Decision("failed", reason, disable_endpoint="gone: the receiver answered 410")
    if kind is Kind.FAILED:
        return Decision("failed", reason)
    delay = retry_delay(attempt, scale=scale, retry_after=result.retry_after_seconds, rng=rng)
    breaker = kind is Kind.RETRY
    auth = kind is Kind.AUTH
    if delay is None:
        return Decision(
            "dead",
            f"retries exhausted after {attempt} attempts; last: {reason}",
            breaker_failure=breaker,
            auth_failure=auth,
        )
    return Decision("pending", reason, delay, breaker_failure=breaker, auth_failure=auth)


@dataclass(frozen=True)
class Gate:
    """Whether a due delivery may be attempted now: ``send``, ``wait`` (seconds), ``fail`` or ``skip``."""

    action: str
    reason: str = ""
    wait_seconds: float = 0.0


def gate(
    *,
    delivery_state: str,
    due: bool,
    endpoint_state: str,
    breaker_open_for: float | None,
    in_flight: int,
    max_concurrency: int,
    has_secret: bool,
    concurrency_wait: float = 0.5,
) -> Gate:
    """The claim decision. Waiting for an open breaker or a full endpoint is not an attempt."""
    if delivery_state != "pending" or not due:
        return Gate("skip", "not due")
    if endpoint_state != "enabled":
        return Gate("fail", "endpoint_disabled: the endpoint was disabled before this delivery was sent")
    if not has_secret:
        return Gate("fail", "no_secret: the endpoint has no secret in force")
    if breaker_open_for is not None and breaker_open_for > 0:
        return Gate("wait", "circuit breaker open: the endpoint kept failing", breaker_open_for)
    if in_flight >= max_concurrency:
        return Gate("wait", f"endpoint at its concurrency cap ({max_concurrency})", concurrency_wait)
    return Gate("send")
