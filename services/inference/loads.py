"""The tenant loads a claim read, kept for the same process's next claims (``KeptLoads``)."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta

from services.inference.fairness import TenantLoad


class KeptLoads:
    """The tenant loads a claim read, used by this process's next claims for ``seconds``.

    Reading them is a probe of every tenant with due work, so with many tenants it cost more than
    the rest of the claim. In between, the process keeps its own count: a start here adds one to the
    tenant's running jobs and takes its new heads from the head job's read (so the priority and
    aging choices see what a fresh read would), a completion here takes one off, and a tenant whose
    due jobs were all taken, or whose job was deferred or failed, is left out until the next read.
    What other processes start and finish meanwhile is seen at that read, as the loads of a read
    were always a moment old: ``max_in_flight`` here is the fair share's filter (two claims reading
    at once could always both take a tenant's last place); a cap that must hold is the limiter's
    per-tenant in-flight limit. A count made in a transaction that then rolled back stays off by
    one until the next read. A claim that finds nothing startable among the kept tenants reads them
    afresh, so a tenant whose first jobs arrive meanwhile waits at most ``seconds``. Thread-safe;
    ``seconds`` 0 keeps nothing (every claim reads).
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._lock = threading.Lock()
        self._loads: dict[uuid.UUID, TenantLoad] = {}
        self._now: datetime | None = None  # the database's clock at the read
        self._read_at = 0.0  # time.monotonic() at the read

    def keep(self, loads: Mapping[uuid.UUID, TenantLoad], now: datetime | None) -> None:
        """Loads just read, with the database's ``now`` (None: no tenant had due work)."""
        with self._lock:
            self._loads, self._now, self._read_at = dict(loads), now, time.monotonic()

    def current(self) -> tuple[dict[uuid.UUID, TenantLoad], datetime] | None:
        """A copy of the kept loads and the database's clock now, or None when they are too old."""
        with self._lock:
            age = time.monotonic() - self._read_at
            if self._seconds <= 0 or self._now is None or age >= self._seconds or not self._loads:
                return None
            return dict(self._loads), self._now + timedelta(seconds=age)

    def started(
        self, tenant_id: uuid.UUID, interactive_head: datetime | None, batch_head: datetime | None
    ) -> None:
        """A job of the tenant started here; its heads are now these (the claim read them)."""
        with self._lock:
            load = self._loads.get(tenant_id)
            if load is not None:
                self._loads[tenant_id] = dataclasses.replace(
                    load, running=load.running + 1, interactive_head=interactive_head, batch_head=batch_head
                )

    def finished(self, tenant_id: uuid.UUID) -> None:
        """A running job of the tenant ended here."""
        with self._lock:
            load = self._loads.get(tenant_id)
            if load is not None:
                self._loads[tenant_id] = dataclasses.replace(load, running=max(0, load.running - 1))

    def forget(self, tenant_id: uuid.UUID) -> None:
        """The tenant's kept load is no longer right (no due job was left to take, or one was
        deferred or failed): it is left out until the next read."""
        with self._lock:
            self._loads.pop(tenant_id, None)
