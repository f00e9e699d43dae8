"""The tenant a request speaks for, as authentication finds it: who, its weight and caps, and the
admission limits its submissions are held to."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TenantLimits:
    max_pending_jobs: int
    max_pending_bytes: int
    max_pending_tokens: int
    daily_token_budget: int
    max_stored_bytes: int = 5 * 1024**3


@dataclass(frozen=True)
class Tenant:
    id: uuid.UUID
    name: str
    weight: int
    max_in_flight: int
    limits: TenantLimits
    allowed_currencies: tuple[str, ...] = field(default_factory=tuple)
