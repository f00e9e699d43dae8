"""Tenants and their master data: creation with a first API key, and supplier import."""

from __future__ import annotations

import csv
import io
import json
import unicodedata
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg_pool import ConnectionPool
from stdnum import iban as iso13616
from stdnum.exceptions import InvalidChecksum, InvalidComponent, InvalidLength, ValidationError

from services.acceptance.queries import Q
from services.common.api import apikeys
from services.common.ids import new_id
from services.common.taxids import normalize_tax_id

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
    tax_id: str  # normalized (services.common.taxids): the key validation looks suppliers up by
    name: str
    iban: str | None  # compact and checksum-checked, or None
    currency: str | None


class SupplierFileError(ValueError):
    """The supplier file cannot be imported; nothing was written. ``problems`` name their rows."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__("; ".join(self.problems))


SUPPLIER_FIELDS = ("tax_id", "name", "iban", "currency")
_MAX_PROBLEMS = 20
# A row is named "row N" (N counts records after the header, from 1) and, in a CSV, by its line;
# it holds its fields, or what makes it unreadable as a row.
_Row = tuple[str, dict[str, object] | str]


def parse_suppliers(path: Path) -> list[Supplier]:
    """Read a CSV (header: tax_id,name[,iban][,currency]) or a JSON array of objects with those keys.

    All or nothing: raises SupplierFileError with every problem found (up to 20), each naming its
    row. Tax ids are normalized before they are compared, so "94-1234567" and "941234567" are one
    supplier: two rows for one supplier are an error naming both (master data must be
    unambiguous), never "the last one wins". A leading byte-order mark (as spreadsheets write it)
    is ignored; one anywhere else, a NUL byte or another control character is an error.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SupplierFileError([f"cannot read {path}: {exc}"]) from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise SupplierFileError([f"{path}: line {line} is not UTF-8 text"]) from None
    rows = _json_rows(path, text) if path.suffix.lower() == ".json" else _csv_rows(path, text)
    problems: list[str] = []
    suppliers: list[Supplier] = []
    first_row: dict[str, tuple[str, str]] = {}  # normalized tax id -> (row, tax id as written)
    for label, row in rows:
        if isinstance(row, str):
            problems.append(f"{label}: {row}")
            continue
        supplier = _supplier(label, row, problems)
        if supplier is None:
            continue
        written = str(row["tax_id"]).strip()
        if supplier.tax_id in first_row:
            other, other_written = first_row[supplier.tax_id]
            problems.append(
                f"{label}: tax_id {written!r} is the same supplier as {other}'s {other_written!r} "
                f"(both are {supplier.tax_id} once normalized)"
            )
            continue
        first_row[supplier.tax_id] = (label, written)
        suppliers.append(supplier)
    if problems:
        more = len(problems) - _MAX_PROBLEMS
        raise SupplierFileError(problems[:_MAX_PROBLEMS] + ([f"and {more} more"] if more > 0 else []))
    return suppliers


def _json_rows(path: Path, text: str) -> list[_Row]:
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SupplierFileError([f"{path}: not valid JSON: {exc}"]) from None
    if not isinstance(loaded, list):
        raise SupplierFileError([f"{path}: expected a JSON array of objects"])
    rows: list[_Row] = []
    for number, item in enumerate(loaded, start=1):
        label = f"row {number}"
        if not isinstance(item, dict):
            rows.append((label, f"expected an object, not {type(item).__name__}"))
            continue
        unknown = sorted(set(item) - set(SUPPLIER_FIELDS))
        if unknown:
            rows.append((label, f"unknown fields {unknown}; known: {list(SUPPLIER_FIELDS)}"))
            continue
        rows.append((label, item))
    return rows


def _csv_rows(path: Path, text: str) -> list[_Row]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = [field.strip() for field in next(reader, [])]
        records = [(reader.line_num, record) for record in reader if record]
    except csv.Error as exc:
        raise SupplierFileError([f"{path}: line {reader.line_num}: {exc}"]) from None
    unknown = [f for f in header if f not in SUPPLIER_FIELDS]
    repeated = sorted({f for f in header if header.count(f) > 1})
    if unknown or repeated or not {"tax_id", "name"} <= set(header):
        raise SupplierFileError(
            [
                f"{path}: the CSV header (line 1) must name tax_id and name, and may name iban and "
                f"currency, each once; it names {header!r}"
            ]
        )
    rows: list[_Row] = []
    for number, (line, record) in enumerate(records, start=1):
        label = f"row {number} (line {line})"
        if len(record) > len(header):
            rows.append((label, f"{len(record)} fields, but the header names {len(header)}"))
            continue
        values = record + [""] * (len(header) - len(record))
        rows.append((label, dict(zip(header, values, strict=True))))
    return rows


def _supplier(label: str, row: dict[str, object], problems: list[str]) -> Supplier | None:
    """The supplier a row describes, or None after adding what is wrong with it to ``problems``."""
    found = len(problems)
    fields: dict[str, str] = {}
    for key in SUPPLIER_FIELDS:
        value = row.get(key)
        if value is None:
            value = ""
        if not isinstance(value, str):
            problems.append(f"{label}: {key} must be text, not {type(value).__name__}")
            continue
        bad = _bad_character(value)
        if bad is not None:
            problems.append(f"{label}: {key} holds {bad}")
            continue
        fields[key] = value.strip()
    if len(problems) > found:
        return None
    tax_id, name = normalize_tax_id(fields["tax_id"]), fields["name"]
    if not fields["tax_id"] or not name:
        problems.append(f"{label}: tax_id and name are required")
    elif not tax_id:
        problems.append(f"{label}: tax_id {fields['tax_id']!r} has no letters or digits")
    currency = fields["currency"].upper() or None
    if currency is not None and currency not in CURRENCY_CODES:
        problems.append(f"{label}: unknown currency {currency}")
    iban = fields["iban"].replace(" ", "").upper() or None
    if iban is not None:
        why = _iban_problem(iban)
        if why is not None:
            problems.append(f"{label}: the IBAN {iban} {why}")
    if len(problems) > found:
        return None
    return Supplier(tax_id, name, iban, currency)


def _bad_character(value: str) -> str | None:
    for char in value:
        if char == "\x00":
            return "a NUL byte"
        if char == "\ufeff":
            return "a byte-order mark (U+FEFF)"
        if unicodedata.category(char) == "Cc":
            return f"a control character (U+{ord(char):04X})"
    return None


def _iban_problem(iban: str) -> str | None:
    """None for a valid IBAN (ISO 13616: checksum, length and format of its country), else why not."""
    if not (iban.isascii() and iban.isalnum()):
        return "holds characters other than letters and digits"
    try:
        iso13616.validate(iban)
    except InvalidChecksum:
        return "fails its checksum"
    except InvalidLength:
        return "has the wrong length"
    except InvalidComponent:
        return "names a country without IBANs"
    except ValidationError:
        return "is not in its country's IBAN format"
    return None


def import_suppliers(pool: ConnectionPool[Any], tenant_id: uuid.UUID, suppliers: list[Supplier]) -> int:
    """Upsert every supplier in one transaction; an unknown tenant writes nothing."""
    with pool.connection() as conn, conn.transaction():
        if conn.execute(Q["tenant_exists"], {"tenant_id": tenant_id}).fetchone() is None:
            raise SupplierFileError([f"there is no tenant {tenant_id}"])
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
