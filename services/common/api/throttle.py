"""Failed authentication is rate-limited per client address: after ``limit`` keys that were
presented and not valid within ``window_seconds``, the address is refused (429 + Retry-After) for
``block_seconds``, valid key or not, so a key cannot be guessed at the edge's speed.

Per worker process and in memory: each of N edge workers allows ``limit`` failures, which bounds a
guesser just the same. Behind a reverse proxy every client shares the proxy's address; the edge
then limits the proxy as a whole (set the limit to 0 to turn this off and limit at the proxy).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque

from services.common.api.errors import ApiError

_MAX_ADDRESSES = 50_000


class TooManyFailedAttempts(ApiError):
    status = 429
    code = "too_many_failed_authentications"


class FailureThrottle:
    def __init__(self, limit: int, window_seconds: float, block_seconds: float) -> None:
        self.limit = limit
        self.window = window_seconds
        self.block = block_seconds
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._blocked_until: dict[str, float] = {}

    def check(self, address: str | None) -> None:
        """Refuse a blocked address (429); anything else passes."""
        if self.limit <= 0 or address is None:
            return
        until = self._blocked_until.get(address)
        if until is None:
            return
        now = time.monotonic()
        if now >= until:
            del self._blocked_until[address]
            return
        raise TooManyFailedAttempts(
            "too many invalid API keys from this address; wait before trying again",
            headers={"Retry-After": str(max(1, round(until - now)))},
        )

    def failed(self, address: str | None) -> None:
        """Count one invalid key presented from ``address``."""
        if self.limit <= 0 or address is None:
            return
        now = time.monotonic()
        recent = self._failures.pop(address, None) or deque()
        recent.append(now)
        while recent and recent[0] <= now - self.window:
            recent.popleft()
        if len(recent) >= self.limit:
            self._blocked_until[address] = now + self.block
            recent.clear()
        else:
            self._failures[address] = recent
            while len(self._failures) > _MAX_ADDRESSES:
                self._failures.popitem(last=False)
