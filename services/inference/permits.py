"""Limiter permits for one attempt: the ``Permits`` the gateway asks per hop, backed by the limiter
client, starting with the permit the claim already holds for the model's primary pool. Every
Acquire of the attempt carries its request_key, so a retried one never takes a second permit."""

from __future__ import annotations

import logging
import threading
import uuid

from services.inference.providers.base import PermitDenied, PermitGranted
from services.limiter import (
    Denial,
    Grant,
    LimiterClient,
    LimiterError,
    NeverAdmittable,
    Outcome,
    PermitNotHeld,
)

log = logging.getLogger(__name__)
# A fallback channel whose pool can never admit the request is skipped as if denied for this long.
_NEVER_RETRY_MS = 60_000


class AttemptPermits:
    def __init__(
        self,
        client: LimiterClient,
        *,
        tenant: str,
        estimated_input_tokens: int,
        max_output_tokens: int,
        lease_ms: int,
        primary_pool: str,
        primary: Grant,
        request_key: str,
    ) -> None:
        self._client = client
        self._tenant = tenant
        self._tokens = estimated_input_tokens
        self._max_out = max_output_tokens
        self._lease_ms = lease_ms
        self._primary_pool = primary_pool
        self._primary: Grant | None = primary
        self._lock = threading.Lock()
        self._held: set[str] = {primary.permit_id}
        self._key = request_key

    def acquire(self, pool: str) -> PermitGranted | PermitDenied:
        with self._lock:
            if pool == self._primary_pool and self._primary is not None:
                grant, self._primary = self._primary, None
                return PermitGranted(grant.permit_id)
        try:
            decision = self._ask(pool, self._key)
        except PermitNotHeld:  # this attempt already used and settled its permit on the pool
            decision = self._ask(pool, f"{self._key}:{uuid.uuid4().hex[:8]}")
        except NeverAdmittable as exc:
            log.warning("pool %s can never admit this request: %s", pool, exc)
            return PermitDenied("NEVER_ADMITTABLE", _NEVER_RETRY_MS)
        if isinstance(decision, Denial):
            return PermitDenied(decision.reason.value, decision.retry_after_ms)
        with self._lock:
            self._held.add(decision.permit_id)
        return PermitGranted(decision.permit_id)

    def _ask(self, pool: str, key: str) -> Grant | Denial:
        return self._client.acquire(
            pool, self._tenant, self._tokens, self._max_out, lease_ms=self._lease_ms, request_key=key
        )

    def release(self, permit: PermitGranted, outcome: str, input_tokens: int, output_tokens: int) -> None:
        with self._lock:
            self._held.discard(permit.permit_id)
        # Not waited for: it travels with the slot's next Acquire. Should it fail, the permit's lease
        # expires on its own; an unknown outcome keeps its reservation anyway.
        self._client.release_later(permit.permit_id, Outcome(outcome), input_tokens, output_tokens)

    def throttle(self, pool: str, retry_after_ms: int) -> None:
        try:
            self._client.report_throttle(pool, retry_after_ms)
        except LimiterError as exc:
            log.warning("could not report a throttle of %d ms on pool %s: %s", retry_after_ms, pool, exc)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._held)

    def renew(self) -> None:
        for permit_id in self.held():
            try:
                self._client.renew(permit_id, self._lease_ms)
            except LimiterError as exc:
                log.warning("could not renew permit %s: %s", permit_id, exc)

    def close(self) -> None:
        """Settle what the gateway never used (NOT_SENT) or left held (UNKNOWN: it may have been sent)."""
        with self._lock:
            unused, self._primary = self._primary, None
            left = self._held - ({unused.permit_id} if unused else set())
            self._held = set()
        # Waited for (a rare path): whoever reads the pool after the attempt finds them settled.
        if unused is not None:
            self._settle_now(unused.permit_id, Outcome.NOT_SENT)
        for permit_id in left:
            self._settle_now(permit_id, Outcome.UNKNOWN)

    def _settle_now(self, permit_id: str, outcome: Outcome) -> None:
        try:
            self._client.release(permit_id, outcome)
        except LimiterError as exc:
            log.warning("could not release permit %s (%s): %s", permit_id, outcome.value, exc)
