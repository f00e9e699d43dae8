"""The development set of the simulated provider's extractor: invoices in the common layouts it
must read (the issue's plain Turkish invoice among them), each extracted in full.

``provider_dev_cases/`` holds the invoices and a manifest of what each states (see
``provider_cases``). Run this file to print the figure:
``.venv/bin/python tests/unit/test_sandbox_dev_cases.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from provider_cases import load_manifest, manifest_problems, report, score

DEV = Path(__file__).resolve().parent / "provider_dev_cases"
MANIFEST = load_manifest(DEV)


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e["file"])
def test_each_dev_case_extracts_fully_and_ends_as_its_manifest_says(entry: dict[str, Any]) -> None:
    result = score(DEV, MANIFEST, entry)
    assert (result.schema_valid, result.wrong, result.error) == (True, (), None)
    assert (result.state, tuple(sorted(result.reasons))) == result.expected


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e["file"])
def test_each_dev_manifest_entry_adds_up(entry: dict[str, Any]) -> None:
    assert manifest_problems(DEV, entry) == []


if __name__ == "__main__":
    print(report(DEV, "dev"))
