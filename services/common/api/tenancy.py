"""The tenant a request speaks for, as authentication finds it: who, its weight and caps, and the
admission limits its submissions are held to."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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


def tenant_from_row(row: Mapping[str, Any]) -> Tenant:
    """A tenant from a row holding the ``tenants`` table's columns (as the key lookup and the Kafka
    ingress read them)."""
    return Tenant(
        id=row["id"],
        name=row["name"],
        weight=row["weight"],
        max_in_flight=row["max_in_flight"],
        limits=TenantLimits(
            max_pending_jobs=row["max_pending_jobs"],
            max_pending_bytes=row["max_pending_bytes"],
            max_pending_tokens=row["max_pending_tokens"],
            daily_token_budget=row["daily_token_budget"],
            max_stored_bytes=row["max_stored_bytes"],
        ),
        allowed_currencies=tuple(row["allowed_currencies"]),
    )
