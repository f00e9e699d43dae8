"""The weighted fair-share choice of DESIGN §2 step 4, as a pure function.

Tenants under their in-flight cap are served least-served first: fewest running jobs per unit of
weight. Ties go to the tenant whose head job has waited longest. Inside a tenant, ``interactive``
work goes before ``batch``, with aging: a batch job that has waited ``aging`` longer than an
interactive one goes first, so batch work is never starved.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta


@dataclass(frozen=True)
class TenantLoad:
    tenant_id: uuid.UUID
    weight: int
    max_in_flight: int
    running: int
    interactive_head: datetime | None  # available_at of its oldest eligible interactive job
    batch_head: datetime | None

    def head_rank(self, aging: timedelta) -> datetime | None:
        """The tenant's best job's rank: interactive jobs count as if they had waited ``aging`` more."""
        ranks = [t for t in (self.interactive_head and self.interactive_head - aging, self.batch_head) if t]
        return min(ranks) if ranks else None

    def runnable(self, now: datetime) -> bool:
        heads = [t for t in (self.interactive_head, self.batch_head) if t is not None]
        return self.running < self.max_in_flight and any(t <= now for t in heads)


def order_tenants(loads: list[TenantLoad], now: datetime, aging: timedelta) -> list[uuid.UUID]:
    """Tenants to try claiming from, best first; tenants at their cap or with nothing due are left out."""
    runnable = [load for load in loads if load.runnable(now)]
    runnable.sort(key=lambda load: (load.running / load.weight, load.head_rank(aging) or now, load.tenant_id))
    return [load.tenant_id for load in runnable]


def prefer(interactive_at: datetime | None, batch_at: datetime | None, aging: timedelta) -> str | None:
    """Which priority's head job a tenant runs next: "interactive", "batch", or None."""
    if interactive_at is None and batch_at is None:
        return None
    if batch_at is None:
        return "interactive"
    if interactive_at is None:
        return "batch"
    return "interactive" if interactive_at - aging <= batch_at else "batch"
