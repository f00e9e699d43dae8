"""Each tenant's supplier master data, kept by the worker under the version it was read at.

Validation looks up one supplier per result (by the extracted tax id), but which one is known only
after the model answers, so an attempt needs the tenant's whole master data at hand. Reading it
with every claim cost O(suppliers) per job. The claim's start statement reads the tenant's
``suppliers_version`` instead (migration 0025: every transaction that writes a tenant's suppliers
gives it a new one), and the master data is read again only when the version moved, in the claim's
own transaction: an attempt validates against the master data as of its claim, as before.

The cache holds at most ``max_suppliers`` suppliers across tenants
(``FATURA_INFERENCE_SUPPLIER_CACHE``), dropping the tenants used least recently; a tenant with more
than that is read with each claim, as before.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping
from types import MappingProxyType

from services.inference.validation import MasterSupplier

Suppliers = Mapping[str, MasterSupplier]  # keyed by normalize_tax_id(tax_id)

DEFAULT_MAX_SUPPLIERS = 50_000  # about 500 bytes each with their strings: some 25 MB


class SupplierCache:
    """Thread-safe: the worker's slots share one."""

    def __init__(self, max_suppliers: int = DEFAULT_MAX_SUPPLIERS) -> None:
        self._max = max_suppliers
        self._lock = threading.Lock()
        self._tenants: OrderedDict[uuid.UUID, tuple[int, Suppliers]] = OrderedDict()
        self._size = 0

    def get(self, tenant_id: uuid.UUID, version: int) -> Suppliers | None:
        """The tenant's suppliers as of ``version``, or None when they must be read."""
        with self._lock:
            kept = self._tenants.get(tenant_id)
            if kept is None or kept[0] != version:
                return None
            self._tenants.move_to_end(tenant_id)
            return kept[1]

    def put(self, tenant_id: uuid.UUID, version: int, suppliers: Mapping[str, MasterSupplier]) -> Suppliers:
        """Keep ``suppliers`` (read at ``version``) and return them, read-only."""
        frozen: Suppliers = MappingProxyType(dict(suppliers))
        with self._lock:
            old = self._tenants.pop(tenant_id, None)
            if old is not None:
                self._size -= len(old[1])
            if len(frozen) > self._max:
                return frozen
            self._tenants[tenant_id] = (version, frozen)
            self._size += len(frozen)
            while self._size > self._max:
                _, (_, dropped) = self._tenants.popitem(last=False)
                self._size -= len(dropped)
        return frozen

    @property
    def size(self) -> int:
        """Suppliers held, across tenants."""
        with self._lock:
            return self._size
