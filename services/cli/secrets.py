"""``fatura secrets new-key|status|rewrap``: the master keys that seal webhook secrets at rest.

Rotating the master key: make a new one (``new-key``), set it as ``FATURA_SECRETS_KEY`` and move
the old one to ``FATURA_SECRETS_OLD_KEYS`` in the edge and the delivery worker, restart them, run
``rewrap`` (with the same two settings), and drop the old key once ``status`` shows no secret
under it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from services.common.db import connect
from services.common.keyring import Keyring, new_key_spec
from services.common.secret_rows import count_by_master_key, rewrap
from services.common.settings import CommonSettings, SettingsError


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "secrets", help="master keys of the webhook secrets stored encrypted (new-key, status, rewrap)"
    )
    actions = parser.add_subparsers(dest="secrets_command", required=True, metavar="ACTION")
    new_key = actions.add_parser(
        "new-key", help="print a new random master key as ID:BASE64, for FATURA_SECRETS_KEY"
    )
    new_key.add_argument("--id", default="k1", help="the key's id, recorded with every secret it seals")
    new_key.set_defaults(func=_new_key)
    status = actions.add_parser("status", help="how many webhook secrets each master key seals (JSON)")
    status.set_defaults(func=_status)
    rewrap_cmd = actions.add_parser(
        "rewrap",
        help="seal again under FATURA_SECRETS_KEY every secret sealed under a key of "
        "FATURA_SECRETS_OLD_KEYS; exit 1 if one does not open",
    )
    rewrap_cmd.add_argument("--batch", type=int, default=200, help="rows per transaction (default 200)")
    rewrap_cmd.set_defaults(func=_rewrap)


def _new_key(args: argparse.Namespace) -> int:
    try:
        print(new_key_spec(args.id))
    except SettingsError as exc:
        print(f"fatura secrets new-key: {exc}", file=sys.stderr)
        return 2
    return 0


def _status(args: argparse.Namespace) -> int:
    keyring = Keyring.from_env()
    with connect(CommonSettings.from_env()) as conn:
        counts = count_by_master_key(conn)
    current = keyring.current.id if keyring else None
    print(json.dumps({"current_key_id": current, "secrets_by_key_id": counts}))
    return 0


def _rewrap(args: argparse.Namespace) -> int:
    keyring = Keyring.from_env()
    if keyring is None:
        raise SettingsError("FATURA_SECRETS_KEY is not set: rewrap seals every secret under it")
    if not 1 <= args.batch <= 10_000:
        print("fatura secrets rewrap: --batch is from 1 to 10000", file=sys.stderr)
        return 2
    with connect(CommonSettings.from_env(), autocommit=True) as conn:
        done = rewrap(conn, keyring, batch=args.batch)
        counts = count_by_master_key(conn)
    for line in done.failed:
        print(f"fatura secrets rewrap: left as it was: {line}", file=sys.stderr)
    print(
        json.dumps(
            {
                "current_key_id": keyring.current.id,
                "resealed": done.resealed,
                "failed": len(done.failed),
                "secrets_by_key_id": counts,
            }
        )
    )
    return 1 if done.failed else 0
