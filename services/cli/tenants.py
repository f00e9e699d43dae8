"""``fatura tenants create NAME``: a tenant and its first API key, printed once as JSON."""

from __future__ import annotations

import argparse
import json
from typing import Any

from services.acceptance.tenants import TenantSpec, create_tenant
from services.common.db import sync_pool
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("tenants", help="manage tenants")
    tenants_sub = parser.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    create = tenants_sub.add_parser(
        "create",
        help="create a tenant; prints {tenant_id, api_key} (the key is shown only this once)",
    )
    defaults = TenantSpec(name="x")
    create.add_argument("name")
    create.add_argument("--weight", type=int, default=defaults.weight, help="fair-share weight (1-1000)")
    create.add_argument("--max-in-flight", type=int, default=defaults.max_in_flight)
    create.add_argument("--max-pending-jobs", type=int, default=defaults.max_pending_jobs)
    create.add_argument("--max-pending-bytes", type=int, default=defaults.max_pending_bytes)
    create.add_argument("--max-pending-tokens", type=int, default=defaults.max_pending_tokens)
    create.add_argument("--daily-token-budget", type=int, default=defaults.daily_token_budget)
    create.add_argument(
        "--allowed-currencies",
        default=",".join(defaults.allowed_currencies),
        help="comma-separated ISO 4217 codes",
    )
    create.set_defaults(func=_create)


def _create(args: argparse.Namespace) -> int:
    try:
        spec = TenantSpec(
            name=args.name,
            weight=args.weight,
            max_in_flight=args.max_in_flight,
            max_pending_jobs=args.max_pending_jobs,
            max_pending_bytes=args.max_pending_bytes,
            max_pending_tokens=args.max_pending_tokens,
            daily_token_budget=args.daily_token_budget,
            allowed_currencies=tuple(
                c.strip().upper() for c in args.allowed_currencies.split(",") if c.strip()
            ),
        )
    except ValueError as exc:
        print(f"fatura tenants create: {exc}")
        return 2
    with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
        tenant_id, api_key = create_tenant(pool, spec)
    print(json.dumps({"tenant_id": str(tenant_id), "api_key": api_key}))
    return 0
