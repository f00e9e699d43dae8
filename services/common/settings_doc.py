"""The configuration reference (docs/configuration.md) against the code: every ``FATURA_*`` name a
module under ``services/`` reads must be listed there, and every name listed must still be read.

``python -m services.common.settings_doc`` prints what disagrees and exits 1; tests run the same check.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "configuration.md"
_READ = re.compile(r'"(FATURA_[A-Z0-9_]+)"')
_NAME = re.compile(r"`(FATURA_[A-Z0-9_]+)`")


@dataclass(frozen=True)
class Drift:
    undocumented: tuple[str, ...]  # read by the code, missing from the reference
    unread: tuple[str, ...]  # in the reference's first column, read by no code

    def __bool__(self) -> bool:
        return bool(self.undocumented or self.unread)


def read_by_code(root: Path = ROOT, folder: str = "services") -> set[str]:
    names: set[str] = set()
    for path in (root / folder).rglob("*.py"):
        names |= set(_READ.findall(path.read_text(encoding="utf-8")))
    return names


def listed(reference: str) -> set[str]:
    """The names in the first column of the reference's table rows."""
    names: set[str] = set()
    for line in reference.splitlines():
        if line.startswith("| `FATURA_"):
            names |= set(_NAME.findall(line.split(" | ")[0]))
    return names


def drift(root: Path = ROOT) -> Drift:
    code = read_by_code(root)
    documented = listed((root / "docs" / "configuration.md").read_text(encoding="utf-8"))
    # The test suite's own settings (FATURA_TEST_DATABASE_URL) are read under tests/.
    read = code | read_by_code(root, "tests")
    return Drift(tuple(sorted(code - documented)), tuple(sorted(documented - read)))


def main() -> int:
    found = drift()
    for name in found.undocumented:
        print(f"{name}: read by the code, missing from docs/configuration.md")
    for name in found.unread:
        print(f"{name}: listed in docs/configuration.md, read by no code")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
