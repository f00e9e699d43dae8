"""Limiter permits for one attempt: the ``Permits`` the gateway asks per hop, backed by the limiter
client, starting with the permit the claim already holds for the model's primary pool."""

from __future__ import annotations

import logging
import threading

from services.inference.providers.base import PermitDenied, PermitGranted
from services.limiter import Denial, Grant, LimiterClient, LimiterError, Outcome

log = logging.getLogger(__name__)


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

    def acquire(self, pool: str) -> PermitGranted | PermitDenied:
        with self._lock:
            if pool == self._primary_pool and self._primary is not None:
                grant, self._primary = self._primary, None
                return PermitGranted(grant.permit_id)
        decision = self._client.acquire(
            pool, self._tenant, self._tokens, self._max_out, lease_ms=self._lease_ms
        )
        if isinstance(decision, Denial):
            return PermitDenied(decision.reason.value, decision.retry_after_ms)
        with self._lock:
            self._held.add(decision.permit_id)
        return PermitGranted(decision.permit_id)

    def release(self, permit: PermitGranted, outcome: str, input_tokens: int, output_tokens: int) -> None:
        with self._lock:
            self._held.discard(permit.permit_id)
        try:
            self._client.release(permit.permit_id, Outcome(outcome), input_tokens, output_tokens)
        except LimiterError as exc:
            # The permit's lease expires on its own; an unknown outcome keeps its reservation anyway.
            log.warning("could not release permit %s (%s): %s", permit.permit_id, outcome, exc)

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
        if unused is not None:
            self.release(PermitGranted(unused.permit_id), Outcome.NOT_SENT.value, 0, 0)
        for permit_id in left:
            self.release(PermitGranted(permit_id), Outcome.UNKNOWN.value, 0, 0)
