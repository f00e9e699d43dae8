"""``fatura sandbox NAME``: the stand-ins for the outside world (simulated provider, reference ERP).

Each sandbox program is one entry in ``SANDBOX_COMMANDS``; adding one is adding a line, so the
engineers building different sandbox programs never edit the same lines.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import Any

from services.cli.extras import require

# name -> ("package.module:function" called with no arguments, one-line help, the extra it needs).
# The function reads its own settings from FATURA_* variables, exactly as `fatura run NAME` does.
SANDBOX_COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "erp": (
        "services.sandbox.erp.server:main",
        "reference ERP webhook receiver (:8091): verifies, dedups by webhook-id, keeps a ledger",
        "sandbox",
    ),
    "provider": (
        "services.sandbox.provider.server:main",
        "simulated OpenAI-compatible LLM provider (:8090): rule-based extraction, limits, faults",
        None,
    ),
}


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser(
        "sandbox",
        help="run a stand-in for the outside world (simulated provider, reference ERP)",
        description="Run one sandbox program in the foreground.",
    )
    names = parser.add_subparsers(dest="sandbox", required=True, metavar="NAME")
    for name, (target, help_text, extra) in SANDBOX_COMMANDS.items():
        command = names.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(func=_runner(name, target, extra))


def _runner(name: str, target: str, extra: str | None) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        if extra is not None:
            require(f"fatura sandbox {name}", extra)
        # Imported only when chosen: one sandbox program's dependencies never slow another's start.
        module_name, _, attr = target.partition(":")
        function: Callable[[], int | None] = getattr(importlib.import_module(module_name), attr)
        return int(function() or 0)

    return run
