"""Entry point of ``fatura``: one subcommand per module, each registering itself."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from services.cli.extras import MissingExtra
from services.common import logs
from services.common.settings import CommonSettings, SettingsError

# Each module exposes register(subparsers) and sets `func` on the parsers it adds.
_COMMAND_MODULES = (
    "services.cli.migrate_cmd",
    "services.cli.up",
    "services.cli.run",
    "services.cli.demo",
    "services.cli.tenants",
    "services.cli.keys",
    "services.cli.endpoints",
    "services.cli.suppliers",
    "services.cli.bench",
    "services.cli.sandbox",
    "services.chaos.cli",
    "services.cli.dlq",
    "services.cli.secrets",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fatura",
        description="Fatura: durable acceptance, LLM extraction and signed delivery of invoices.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in _COMMAND_MODULES:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        common = CommonSettings.from_env()
    except SettingsError as exc:
        print(f"fatura: bad setting: {exc}", file=sys.stderr)
        return 2
    logs.setup(common.log_level, common.log_format)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except SettingsError as exc:
        print(f"fatura: bad setting: {exc}", file=sys.stderr)
        return 2
    except MissingExtra as exc:
        print(f"fatura: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
