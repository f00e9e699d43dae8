"""``fatura endpoints add``: register a tenant's webhook endpoint; prints it as JSON with its secret."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from services.common.api.auth import Authenticator
from services.common.api.errors import Unauthorized
from services.common.db import async_pool
from services.delivery.errors import DeliveryError
from services.delivery.payload import EVENT_TYPES
from services.delivery.settings import DeliverySettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("endpoints", help="manage webhook endpoints")
    actions = parser.add_subparsers(dest="endpoints_command", required=True, metavar="ACTION")
    add = actions.add_parser(
        "add",
        help="register a webhook endpoint; prints it with its secret (shown only this once) and the "
        "verification ping queued for the delivery service",
    )
    add.add_argument("url")
    add.add_argument("--tenant-key", required=True, help="the tenant's API key")
    add.add_argument(
        "--events",
        default=",".join(EVENT_TYPES),
        help=f"comma-separated event types (default: {', '.join(EVENT_TYPES)}; "
        "review.requested.v1 only when named)",
    )
    add.set_defaults(func=_add)


async def _add_async(settings: DeliverySettings, key: str, url: str, events: list[str]) -> dict[str, Any]:
    from services.delivery.endpoints import Endpoints

    async with async_pool(settings.common, name="cli", max_size=1, autocommit=True) as pool:
        tenant = await Authenticator(pool, 0).authenticate(f"Bearer {key}")
        return await Endpoints(pool, settings).register(tenant.id, url, events)


def _add(args: argparse.Namespace) -> int:
    events = [e.strip() for e in args.events.split(",") if e.strip()]
    try:
        created = asyncio.run(_add_async(DeliverySettings.from_env(), args.tenant_key, args.url, events))
    except Unauthorized as exc:
        print(f"fatura endpoints add: {exc.message}", file=sys.stderr)
        return 2
    except DeliveryError as exc:
        print(f"fatura endpoints add: {exc.code}: {exc.message}", file=sys.stderr)
        return 2
    print(json.dumps(created))
    return 0
