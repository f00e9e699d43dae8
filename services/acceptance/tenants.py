"""Tenants and their master data: creation with a first API key, and supplier import."""

from __future__ import annotations

import csv
import io
import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool

from services.acceptance.queries import Q
from services.common.api import apikeys
from services.common.ids import new_id

CURRENCY_CODES = frozenset(
    "TRY EUR USD GBP CHF JPY CNY SEK NOK DKK PLN CZK HUF RON BGN CAD AUD NZD AED SAR INR RUB".split()
)


@dataclass(frozen=True)
class TenantSpec:
    name: str
    weight: int = 1
    max_in_flight: int = 8
    max_pending_jobs: int = 20_000
    max_pending_bytes: int = 1024**3
    max_pending_tokens: int = 200_000_000
    daily_token_budget: int = 500_000_000
    max_stored_bytes: int = 5 * 1024**3
    allowed_currencies: tuple[str, ...] = ("TRY", "EUR", "USD", "GBP")

    def __post_init__(self) -> None:
        if not 1 <= len(self.name) <= 200:
            raise ValueError("a tenant name has 1 to 200 characters")
        if not 1 <= self.weight <= 1000:
            raise ValueError("weight must be between 1 and 1000")
        if not 1 <= self.max_in_flight <= 100_000:
            raise ValueError("max in-flight must be between 1 and 100000")
        for name in (
            "max_pending_jobs",
            "max_pending_bytes",
            "max_pending_tokens",
            "daily_token_budget",
            "max_stored_bytes",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative")
        unknown = [c for c in self.allowed_currencies if c not in CURRENCY_CODES]
        if unknown or not self.allowed_currencies:
            raise ValueError(f"allowed currencies must be ISO 4217 codes we know; unknown: {unknown}")


def create_tenant(pool: ConnectionPool[Any], spec: TenantSpec) -> tuple[uuid.UUID, str]:
    """Create a tenant and its first API key; returns (tenant_id, plaintext key shown once)."""
    tenant_id = new_id()
    key = apikeys.generate()
    with pool.connection() as conn, conn.transaction():
        conn.execute(
            Q["create_tenant"],
            {
                "id": tenant_id,
                "name": spec.name,
                "weight": spec.weight,
                "max_in_flight": spec.max_in_flight,
                "max_pending_jobs": spec.max_pending_jobs,
                "max_pending_bytes": spec.max_pending_bytes,
                "max_pending_tokens": spec.max_pending_tokens,
                "daily_token_budget": spec.daily_token_budget,
                "max_stored_bytes": spec.max_stored_bytes,
                "allowed_currencies": list(spec.allowed_currencies),
            },
        )
        conn.execute(
            Q["create_api_key"],
            {"id": new_id(), "tenant_id": tenant_id, "prefix": key.prefix, "secret_hash": key.secret_hash},
        )
    return tenant_id, key.plaintext


@dataclass(frozen=True)
class Supplier:
    tax_id: str
    name: str
    iban: str | None
    currency: str | None


class SupplierFileError(ValueError):
    """The supplier file cannot be imported; nothing was written."""


def parse_suppliers(path: Path) -> list[Supplier]:
    """Read a CSV (header: tax_id,name,iban,currency) or a JSON array of objects with those keys."""
    try:
        raw = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SupplierFileError(f"cannot read {path}: {exc}") from None
    rows: list[dict[str, Any]]
    if path.suffix.lower() == ".json":
        try:
            loaded = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise SupplierFileError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(loaded, list) or not all(isinstance(r, dict) for r in loaded):
            raise SupplierFileError(f"{path}: expected a JSON array of objects")
        rows = loaded
    else:
        reader = csv.DictReader(io.StringIO(raw))
        if reader.fieldnames is None or not {"tax_id", "name"} <= set(reader.fieldnames):
            raise SupplierFileError(f"{path}: the CSV header must name at least tax_id and name")
        rows = list(reader)
    suppliers: list[Supplier] = []
    problems: list[str] = []
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        unknown = set(row) - {"tax_id", "name", "iban", "currency"}
        tax_id = str(row.get("tax_id") or "").strip()
        name = str(row.get("name") or "").strip()
        iban = str(row.get("iban") or "").replace(" ", "").upper() or None
        currency = str(row.get("currency") or "").strip().upper() or None
        if unknown:
            problems.append(f"row {number}: unknown fields {sorted(unknown)}")
        if not tax_id or not name:
            problems.append(f"row {number}: tax_id and name are required")
        if tax_id in seen:
            problems.append(f"row {number}: tax_id {tax_id} appears twice")
        if currency is not None and currency not in CURRENCY_CODES:
            problems.append(f"row {number}: unknown currency {currency}")
        if iban is not None and not iban.isalnum():
            problems.append(f"row {number}: the IBAN holds characters other than letters and digits")
        seen.add(tax_id)
        suppliers.append(Supplier(tax_id, name, iban, currency))
    if problems:
        raise SupplierFileError("; ".join(problems[:20]))
    return suppliers


def import_suppliers(pool: ConnectionPool[Any], tenant_id: uuid.UUID, suppliers: list[Supplier]) -> int:
    """Upsert every supplier in one transaction; an unknown tenant writes nothing."""
    with pool.connection() as conn, conn.transaction():
        if conn.execute(Q["tenant_exists"], {"tenant_id": tenant_id}).fetchone() is None:
            raise SupplierFileError(f"there is no tenant {tenant_id}")
        with conn.cursor() as cur:
            cur.executemany(
                Q["upsert_supplier"],
                [
                    {
                        "tenant_id": tenant_id,
                        "tax_id": s.tax_id,
                        "name": s.name,
                        "iban": s.iban,
                        "currency": s.currency,
                    }
                    for s in suppliers
                ],
            )
    return len(suppliers)
