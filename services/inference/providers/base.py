"""What the worker asks of a provider and what it gets back (no I/O here).

The worker calls ``Provider.complete`` once per attempt. The answer says whether a request left the
worker (for the limiter's refund rule, DESIGN §5.5), lists every hop made across the routing chain
(each becomes a row in ``job_attempts``), and classifies a failure so the retry schedule can act on
it. ``complete`` never raises for a provider problem: every failure is an outcome.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from services.inference.providers.cancel import CallScope


class ErrorClass(StrEnum):
    """Why a call gave no usable answer. Retryable classes may be retried within the budget."""

    RATE_LIMITED = "rate_limited"  # 429
    SERVER_ERROR = "server_error"  # 5xx
    CONNECTION = "connection_error"
    HEADER_TIMEOUT = "header_timeout"
    DEADLINE = "deadline_exceeded"  # the attempt's own deadline passed mid-call
    STREAM_ERROR = "stream_error"  # a decisive error frame inside a 200 stream
    BAD_REQUEST = "bad_request"  # 400 / 422
    UNAUTHORIZED = "unauthorized"  # 401 / 403
    PAYMENT_REQUIRED = "payment_required"  # 402
    NOT_FOUND = "not_found"  # 404 (model or route unknown)
    BAD_RESPONSE = "bad_response"  # 2xx whose envelope is not a chat completion, or too large
    NO_CHANNEL = "no_channel"  # every channel of the chain is open (circuit breaker) or unusable
    CANCELLED = "cancelled"  # the worker lost the job (lease taken, job cancelled): the call was cut


RETRYABLE = frozenset(
    {
        ErrorClass.RATE_LIMITED,
        ErrorClass.SERVER_ERROR,
        ErrorClass.CONNECTION,
        ErrorClass.HEADER_TIMEOUT,
        ErrorClass.DEADLINE,
        ErrorClass.STREAM_ERROR,
        ErrorClass.BAD_RESPONSE,
        ErrorClass.NO_CHANNEL,
        # Only a worker that lost the job cuts its call, and then its completion is refused as
        # stale anyway; should one ever still own it, trying again is the safe reading.
        ErrorClass.CANCELLED,
    }
)


@dataclass(frozen=True)
class ProviderRequest:
    model: str  # the model asked for; never swapped for another
    messages: list[dict[str, Any]]
    max_output_tokens: int
    deadline_s: float  # seconds this attempt may take in all, across every hop
    request_id: str  # job id + attempt, sent as a header for tracing
    # Cut the call when the worker no longer owns the job (``CallScope.cancel()``); None: never.
    cancel: CallScope | None = None


@dataclass(frozen=True)
class Hop:
    """One HTTP exchange with one channel."""

    channel: str
    model: str  # the upstream model name that channel was asked for
    started_at: datetime
    ended_at: datetime
    outcome: str  # "ok" or an ErrorClass value, or "skipped" (breaker open: nothing sent)
    http_status: int | None = None
    error_class: ErrorClass | None = None
    retry_after_ms: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    latency_ms: int | None = None
    sent: bool = True  # whether the request may have reached the provider
    # Why a "skipped" hop sent nothing: "breaker_open", or "limiter:<denial reason>".
    skip_reason: str | None = None
    # The model the response says answered (providers may name a dated variant of ``model``).
    answered_model: str | None = None
    # What went wrong, in the provider's or the gateway's own words: for the operator's attempt log
    # only, never shown to the tenant (services/common/job_errors.py).
    error_message: str | None = None
    # A streamed answer's time to first token (from sending) and mean inter-token latency (between
    # content frames), in ms; None when the hop streamed no content.
    time_to_first_token_ms: int | None = None
    inter_token_ms: float | None = None


@dataclass(frozen=True)
class ProviderResult:
    content: str | None  # the model's message content, when a hop answered
    hops: list[Hop] = field(default_factory=list)
    error_class: ErrorClass | None = None
    error_message: str | None = None
    retry_after_ms: int | None = None  # the largest Retry-After any hop was given
    # Set when nothing was sent because the limiter denied every usable channel: the job is
    # deferred by this many ms, which is not an attempt (DESIGN §2 step 5).
    deferred_ms: int | None = None
    deferred_reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.content is not None

    @property
    def sent(self) -> bool:
        return any(h.sent for h in self.hops)

    @property
    def answered(self) -> bool:
        """Some hop got a complete answer, so reported usage is known."""
        return any(h.outcome == "ok" for h in self.hops)

    @property
    def retryable(self) -> bool:
        return self.error_class in RETRYABLE

    @property
    def input_tokens(self) -> int:
        return sum(h.input_tokens or 0 for h in self.hops)

    @property
    def output_tokens(self) -> int:
        return sum(h.output_tokens or 0 for h in self.hops)


@dataclass(frozen=True)
class PermitGranted:
    permit_id: str


@dataclass(frozen=True)
class PermitDenied:
    reason: str
    retry_after_ms: int


class Permits(Protocol):
    """Limiter permits for one attempt, supplied by the worker (which also renews the permit it holds
    from its heartbeat). The gateway asks for a permit on a channel's pool before each hop, releases
    it after the hop with the outcome, and reports a provider 429 as a pool throttle."""

    def acquire(self, pool: str) -> PermitGranted | PermitDenied: ...

    def release(self, permit: PermitGranted, outcome: str, input_tokens: int, output_tokens: int) -> None:
        """``outcome``: "COMPLETED" (answered), "NOT_SENT" (refund) or "UNKNOWN" (sent, no answer)."""

    def throttle(self, pool: str, retry_after_ms: int) -> None: ...


class Provider(Protocol):
    def complete(self, request: ProviderRequest, permits: Permits) -> ProviderResult: ...

    def close(self) -> None: ...
