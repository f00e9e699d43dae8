"""The README is part of the contract: its opening commands and its settings table stay true."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_opens_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()[:6]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


def test_every_setting_the_code_reads_is_in_the_readme_table() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    used: set[str] = set()
    for path in (ROOT / "services").rglob("*.py"):
        used |= set(re.findall(r'"(FATURA_[A-Z0-9_]+)"', path.read_text(encoding="utf-8")))
    documented = set(re.findall(r"`(FATURA_[A-Z0-9_]+)`", readme))
    assert used, "no settings found: the scan is broken"
    assert sorted(used - documented) == []
