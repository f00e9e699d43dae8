"""The configuration reference (docs/configuration.md) against the code: every ``FATURA_*`` name a
module under ``services/`` reads must be listed there, every name listed must still be read, and a
default the code spells as a literal (``env_int(env, NAME, 30)``) must be the one listed.

``python -m services.common.settings_doc`` prints what disagrees and exits 1; tests run the same check.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_READ = re.compile(r'"(FATURA_[A-Z0-9_]+)"')
_NAME = re.compile(r"`(FATURA_[A-Z0-9_]+)`")
_LITERAL = re.compile(r"`([^`]*)`(?: \(.*\))?")
_UNSET = ("(none", "unset")

Literal = str | int | float


@dataclass(frozen=True)
class Drift:
    undocumented: tuple[str, ...]  # read by the code, missing from the reference
    unread: tuple[str, ...]  # in the reference's first column, read by no code
    wrong_defaults: tuple[str, ...]  # "NAME: code says X, the reference Y"

    def __bool__(self) -> bool:
        return bool(self.undocumented or self.unread or self.wrong_defaults)


def read_by_code(root: Path = ROOT, folder: str = "services") -> set[str]:
    names: set[str] = set()
    for path in (root / folder).rglob("*.py"):
        names |= set(_READ.findall(path.read_text(encoding="utf-8")))
    return names


def code_defaults(root: Path = ROOT) -> dict[str, set[Literal]]:
    """Defaults passed as literals next to a setting's name: ``f(env, NAME, <literal>, ...)``."""
    found: dict[str, set[Literal]] = {}
    for path in (root / "services").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or len(node.args) < 3:
                continue
            name, default = node.args[1], node.args[2]
            if (
                isinstance(name, ast.Constant)
                and isinstance(name.value, str)
                and name.value.startswith("FATURA_")
                and isinstance(default, ast.Constant)
                and isinstance(default.value, str | int | float)
            ):
                found.setdefault(name.value, set()).add(default.value)
    return found


def listed(reference: str) -> dict[str, str]:
    """Each name in the first column of the reference's table rows, with its default column (a row
    naming ``A`` / ``B`` with defaults ``1`` / ``2`` gives each its own)."""
    names: dict[str, str] = {}
    for line in reference.splitlines():
        if not line.startswith("| `FATURA_"):
            continue
        columns = line.split(" | ")
        row_names = _NAME.findall(columns[0])
        defaults = [part.strip() for part in columns[1].split(" / ")]
        for index, name in enumerate(row_names):
            names[name] = defaults[index] if len(defaults) == len(row_names) else columns[1].strip()
    return names


def _agrees(code: Literal, documented: str) -> bool:
    if code == "":
        return documented.startswith(_UNSET)
    match = _LITERAL.fullmatch(documented)
    if match is None:
        return True  # described in words: nothing to compare
    text = match.group(1)
    if isinstance(code, bool):
        return text == ("1" if code else "0")
    if isinstance(code, int | float):
        try:
            return float(text) == float(code)
        except ValueError:
            return False
    return text == code


def drift(root: Path = ROOT) -> Drift:
    code = read_by_code(root)
    documented = listed((root / "docs" / "configuration.md").read_text(encoding="utf-8"))
    # The test suite's own settings (FATURA_TEST_DATABASE_URL) are read under tests/.
    read = code | read_by_code(root, "tests")
    wrong = [
        f"{name}: the code says {value!r}, docs/configuration.md {documented[name]}"
        for name, values in sorted(code_defaults(root).items())
        if name in documented
        for value in sorted(values, key=repr)
        if not _agrees(value, documented[name])
    ]
    return Drift(tuple(sorted(code - set(documented))), tuple(sorted(set(documented) - read)), tuple(wrong))


def main() -> int:
    found = drift()
    for name in found.undocumented:
        print(f"{name}: read by the code, missing from docs/configuration.md")
    for name in found.unread:
        print(f"{name}: listed in docs/configuration.md, read by no code")
    for line in found.wrong_defaults:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
