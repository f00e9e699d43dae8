"""``fatura migrate``: apply pending SQL migrations."""

from __future__ import annotations

import argparse
from typing import Any

from services.common.migrate import migrate
from services.common.settings import CommonSettings


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "migrate", help="apply pending SQL migrations (safe to run twice, or from two processes)"
    )
    parser.set_defaults(func=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    settings = CommonSettings.from_env()
    applied = migrate(settings.database_url)
    if applied:
        for m in applied:
            print(f"applied {m.version:04d}_{m.name}")
    else:
        print("database is up to date")
    return 0
