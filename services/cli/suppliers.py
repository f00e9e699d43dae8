"""``fatura suppliers import FILE --tenant ID``: supplier master data for validation (CSV or JSON)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from services.acceptance.tenants import SupplierFileError, import_suppliers, parse_suppliers
from services.common.db import sync_pool
from services.common.ids import parse_uuid
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("suppliers", help="manage supplier master data")
    suppliers_sub = parser.add_subparsers(dest="suppliers_command", required=True, metavar="ACTION")
    imp = suppliers_sub.add_parser(
        "import",
        help="import suppliers from CSV (tax_id,name,iban,currency) or a JSON array; all or nothing "
        "(a row with a problem is named, and nothing is written)",
    )
    imp.add_argument("file", type=Path)
    imp.add_argument("--tenant", required=True, help="tenant id")
    imp.set_defaults(func=_import)


def _import(args: argparse.Namespace) -> int:
    tenant_id = parse_uuid(args.tenant)
    if tenant_id is None:
        print(f"fatura suppliers import: {args.tenant!r} is not a tenant id", file=sys.stderr)
        return 2
    try:
        suppliers = parse_suppliers(args.file)
        with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
            count = import_suppliers(pool, tenant_id, suppliers)
    except SupplierFileError as exc:
        print(f"fatura suppliers import: {args.file}: nothing was imported", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    print(f"imported {count} suppliers for tenant {tenant_id}")
    return 0
