"""When a request that got no useful answer is sent again, decided in one place for both clients.

429 and 503 wrote nothing, so any request may be repeated after their ``Retry-After``. A request
whose connection broke after it was sent may have taken effect: it is repeated only when repeating
is harmless (a GET, a cancel, a submission under its Idempotency-Key).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from fatura_sdk.errors import FaturaError, RateLimited, ServiceUnavailable, TransportError, is_transient


@dataclass(frozen=True)
class RetryPolicy:
    """``max_attempts`` sends in all; exponential backoff with jitter between them, or the server's
    ``Retry-After`` when it gives one. A ``Retry-After`` beyond ``max_retry_after`` (a daily budget
    spent until midnight) is not waited out: the error is raised at once with its ``retry_after``."""

    max_attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 30.0
    max_retry_after: float = 120.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")

    def delay(
        self, attempt: int, error: FaturaError, *, idempotent: bool, rng: random.Random | None = None
    ) -> float | None:
        """Seconds to wait before send number ``attempt + 1`` after ``error``; None: raise it."""
        if attempt >= self.max_attempts or not is_transient(error):
            return None
        if isinstance(error, TransportError) and error.sent and not idempotent:
            return None
        if not idempotent and not isinstance(error, RateLimited | ServiceUnavailable | TransportError):
            return None  # a 5xx after a non-repeatable request may have had its effect
        rng = rng or random.Random()
        retry_after = getattr(error, "retry_after", None)
        if isinstance(retry_after, int | float):
            if retry_after > self.max_retry_after:
                return None
            return float(retry_after) + rng.uniform(0.0, min(1.0, self.base_delay))
        backoff = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        return float(backoff / 2 + rng.uniform(0.0, backoff / 2))


NO_RETRIES = RetryPolicy(max_attempts=1)
