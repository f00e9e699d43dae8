"""Limiter service: atomic multi-dimensional permits for provider pools, kept in Redis (DESIGN §5.5).

Other services use the limiter through this package's public surface only: the blocking client
and the values it returns (``services.limiter.client`` re-exported here). Everything else in the
package is the service's own.
"""

from services.limiter.client import (
    Denial,
    DenyReason,
    Dimension,
    Grant,
    LimiterClient,
    LimiterError,
    LimiterUnauthenticated,
    LimiterUnavailable,
    NeverAdmittable,
    Outcome,
    PermitNotHeld,
    PoolStatus,
)

__all__ = [
    "Denial",
    "DenyReason",
    "Dimension",
    "Grant",
    "LimiterClient",
    "LimiterError",
    "LimiterUnauthenticated",
    "LimiterUnavailable",
    "NeverAdmittable",
    "Outcome",
    "PermitNotHeld",
    "PoolStatus",
]
