"""``fatura keys create|list|revoke``: API keys by scope (tenant, reviewer, operator).

``create`` prints the key once, as JSON; ``list`` never shows a secret.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from typing import Any

from services.acceptance.keys import KeyInfo, KeyRequestError, create_key, list_keys, revoke_key, rotate_key
from services.cli.extras import require
from services.common.api.apikeys import OPERATOR, REVIEWER, TENANT
from services.common.db import sync_pool
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("keys", help="manage API keys and their scopes")
    actions = parser.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    create = actions.add_parser(
        "create",
        help="create a key; prints it as JSON (the key is shown only this once)",
        description="A tenant key (the default scope) or a reviewer key belongs to one tenant; an "
        "operator key belongs to none and opens only the /v1/ops routes.",
    )
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--tenant", metavar="ID", help="the tenant the key belongs to")
    owner.add_argument("--operator", action="store_true", help="a cross-tenant operator key")
    create.add_argument("--scope", choices=(TENANT, REVIEWER), help="for --tenant (default: tenant)")
    create.add_argument("--label", help="what the key is for, shown by `keys list`")
    create.set_defaults(func=_create)

    listing = actions.add_parser("list", help="list keys (prefix, scope, label, dates; never the secret)")
    which = listing.add_mutually_exclusive_group()
    which.add_argument("--tenant", metavar="ID", help="only this tenant's keys")
    which.add_argument("--operator", action="store_true", help="only operator keys")
    listing.add_argument("--json", action="store_true", help="JSON lines instead of a table")
    listing.set_defaults(func=_list)

    revoke = actions.add_parser("revoke", help="revoke a key by its prefix (fat_<prefix>_...)")
    revoke.add_argument("prefix")
    revoke.set_defaults(func=_revoke)

    rotate = actions.add_parser(
        "rotate",
        help="replace a key: print a new one (same scope, tenant, label); the old one ends after a grace",
    )
    rotate.add_argument("prefix")
    rotate.add_argument(
        "--grace",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="how long the old key keeps working (default 3600; 0 revokes it at once)",
    )
    rotate.set_defaults(func=_rotate)


def _fail(action: str, message: str) -> int:
    print(f"fatura keys {action}: {message}", file=sys.stderr)
    return 2


def _tenant_id(raw: str | None) -> uuid.UUID | None:
    if raw is None:
        return None
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise KeyRequestError(f"--tenant {raw!r} is not a tenant id (a UUID)") from None


def _create(args: argparse.Namespace) -> int:
    if args.operator and args.scope is not None:
        return _fail("create", "--scope goes with --tenant; an operator key has the operator scope")
    try:
        tenant_id = _tenant_id(args.tenant)
        scope = OPERATOR if args.operator else (args.scope or TENANT)
        with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
            info, plaintext = create_key(pool, scope=scope, tenant_id=tenant_id, label=args.label)
    except KeyRequestError as exc:
        return _fail("create", str(exc))
    print(json.dumps({"api_key": plaintext, **info.as_json()}))
    return 0


def _list(args: argparse.Namespace) -> int:
    try:
        tenant_id = _tenant_id(args.tenant)
    except KeyRequestError as exc:
        return _fail("list", str(exc))
    if not args.json:
        require("fatura keys list", "cli", hint="or add --json")
    with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
        keys = list_keys(pool, tenant_id=tenant_id, operator=args.operator)
    if args.json:
        for key in keys:
            print(json.dumps(key.as_json()))
        return 0
    _table(keys)
    return 0


def _table(keys: list[KeyInfo]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{len(keys)} API key(s)", title_justify="left")
    for column in ("prefix", "scope", "label", "tenant", "created", "revoked"):
        table.add_column(column, overflow="fold")
    for key in keys:
        table.add_row(
            key.prefix,
            key.scope,
            key.label or "",
            str(key.tenant_id) if key.tenant_id else "-",
            key.created_at.strftime("%Y-%m-%d %H:%M:%S %Z"),
            key.revoked_at.strftime("%Y-%m-%d %H:%M:%S %Z") if key.revoked_at else "",
        )
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def _rotate(args: argparse.Namespace) -> int:
    try:
        with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
            old, new, plaintext = rotate_key(pool, args.prefix, grace_seconds=args.grace)
    except KeyRequestError as exc:
        return _fail("rotate", str(exc))
    print(json.dumps({"api_key": plaintext, **new.as_json(), "replaces": old.as_json()}))
    return 0


def _revoke(args: argparse.Namespace) -> int:
    try:
        with sync_pool(CommonSettings.from_env(), name="cli", max_size=1) as pool:
            info = revoke_key(pool, args.prefix)
    except KeyRequestError as exc:
        return _fail("revoke", str(exc))
    print(json.dumps(info.as_json()))
    return 0
