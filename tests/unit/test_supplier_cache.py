"""The worker's master-data cache: what it keeps, for how long, and within what bound."""

from __future__ import annotations

import uuid

import pytest

from services.inference.suppliers import SupplierCache
from services.inference.validation import MasterSupplier


def master(count: int) -> dict[str, MasterSupplier]:
    return {f"T{n}": MasterSupplier(f"T{n}", f"S{n}", None, None) for n in range(count)}


def test_a_tenants_suppliers_are_kept_for_their_version_only() -> None:
    cache, tenant = SupplierCache(max_suppliers=10), uuid.uuid4()
    kept = cache.put(tenant, 7, master(3))
    assert cache.get(tenant, 7) is kept and len(kept) == 3
    assert cache.get(tenant, 8) is None  # the master data changed since
    assert cache.get(uuid.uuid4(), 7) is None


def test_kept_suppliers_cannot_be_changed_by_an_attempt() -> None:
    kept = SupplierCache().put(uuid.uuid4(), 1, master(1))
    with pytest.raises(TypeError):
        kept["T9"] = MasterSupplier("T9", "X", None, None)  # type: ignore[index]


def test_the_least_recently_used_tenants_go_first_when_the_bound_is_reached() -> None:
    cache = SupplierCache(max_suppliers=10)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    cache.put(a, 1, master(4))
    cache.put(b, 1, master(4))
    assert cache.get(a, 1) is not None  # a is now the more recent
    cache.put(c, 1, master(4))  # 12 > 10: b goes
    assert cache.get(b, 1) is None and cache.get(a, 1) is not None and cache.get(c, 1) is not None
    assert cache.size == 8


def test_a_tenant_bigger_than_the_bound_is_returned_but_not_kept() -> None:
    cache, small, big = SupplierCache(max_suppliers=10), uuid.uuid4(), uuid.uuid4()
    cache.put(small, 1, master(5))
    assert len(cache.put(big, 1, master(11))) == 11
    assert cache.get(big, 1) is None and cache.get(small, 1) is not None and cache.size == 5


def test_a_new_version_replaces_the_old_one_in_the_count() -> None:
    cache, tenant = SupplierCache(max_suppliers=10), uuid.uuid4()
    cache.put(tenant, 1, master(6))
    cache.put(tenant, 2, master(3))
    assert cache.get(tenant, 1) is None and cache.get(tenant, 2) is not None and cache.size == 3
