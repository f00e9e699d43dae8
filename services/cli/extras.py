"""The optional parts of an install (pyproject's extras) and the clear refusal when one is missing.

The services run on the runtime dependencies alone. A command that needs more (tables and live
views, the reference ERP, charts) imports it when it runs, after ``require`` has checked for it.
"""

from __future__ import annotations

import importlib

# extra -> the modules it brings (each distribution has its module's name). Kept equal to
# [project.optional-dependencies] by tests/unit/test_packaging.py.
EXTRAS: dict[str, tuple[str, ...]] = {
    "cli": ("rich",),
    "sandbox": ("aiohttp",),
    "bench": ("matplotlib", "aiohttp", "rich", "httptools"),
    "kafka": ("confluent_kafka",),
}


class MissingExtra(RuntimeError):
    """A command needs an extra this install does not have; ``fatura`` prints it and exits 2."""

    def __init__(self, command: str, extra: str, module: str, hint: str | None = None) -> None:
        message = f"{command} needs the '{extra}' extra ({module} is not installed)"
        super().__init__(f"{message}: pip install 'fatura[{extra}]'" + (f", {hint}" if hint else ""))
        self.extra = extra


def require(command: str, *extras: str, hint: str | None = None) -> None:
    """Raise ``MissingExtra`` naming the first module of ``extras`` that cannot be imported."""
    for extra in extras:
        for module in EXTRAS[extra]:
            try:
                importlib.import_module(module)
            except ImportError:
                raise MissingExtra(command, extra, module, hint) from None
