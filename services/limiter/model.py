"""Values exchanged by the limiter's core, its gRPC servicer and its client (no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class DenyReason(StrEnum):
    RPM = "RPM"
    TPM = "TPM"
    IN_FLIGHT = "IN_FLIGHT"
    TENANT_IN_FLIGHT = "TENANT_IN_FLIGHT"
    TENANT_BUDGET = "TENANT_BUDGET"
    COOLDOWN = "COOLDOWN"
    KV_TOKENS = "KV_TOKENS"  # a local pool's in-flight context tokens (its KV cache) are taken
    # Client side only: the limiter could not be reached and no emergency permit was available.
    UNAVAILABLE = "UNAVAILABLE"


class Outcome(StrEnum):
    """How the provider call behind a permit ended; decides what a release refunds (DESIGN §5.5)."""

    COMPLETED = "COMPLETED"  # answered: tokens corrected to the reported usage
    NOT_SENT = "NOT_SENT"  # never left the worker: request and tokens refunded
    UNKNOWN = "UNKNOWN"  # sent, no answer: the whole reservation is kept


@dataclass(frozen=True)
class AcquireRequest:
    pool: str
    tenant: str
    estimated_input_tokens: int
    max_output_tokens: int
    lease_ms: int
    request_key: str

    @property
    def reserved_tokens(self) -> int:
        return self.estimated_input_tokens + self.max_output_tokens


@dataclass(frozen=True)
class Grant:
    permit_id: str
    lease_expires_at_ms: int  # Unix epoch milliseconds on the Redis clock
    # True for a permit from the client's local emergency quota (never known to the limiter).
    emergency: bool = False


@dataclass(frozen=True)
class Denial:
    reason: DenyReason
    retry_after_ms: int


@dataclass(frozen=True)
class Dimension:
    limit: int
    used: int

    @property
    def headroom(self) -> int:
        return max(0, self.limit - self.used)


@dataclass(frozen=True)
class PoolStatus:
    pool: str
    window_ms: int
    requests: Dimension
    tokens: Dimension
    in_flight: Dimension
    cooldown_until_ms: int | None
    observed_at_ms: int
