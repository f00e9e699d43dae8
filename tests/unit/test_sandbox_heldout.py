"""The simulated provider measured on invoices it was not written against (the held-out set).

``services/sandbox/samples/heldout/`` holds twenty invoices and a manifest of what each states
(see ``provider_cases``). They were committed before the extractor learnt more layouts and are
never used to develop it: ``provider_dev_cases/`` is for that.

Run this file to print the figure: ``.venv/bin/python tests/unit/test_sandbox_heldout.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from provider_cases import load_manifest, manifest_problems, report

HELDOUT = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "samples" / "heldout"
MANIFEST = load_manifest(HELDOUT)


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e["file"])
def test_each_heldout_manifest_entry_adds_up(entry: dict[str, Any]) -> None:
    assert manifest_problems(HELDOUT, entry) == []


def test_the_heldout_set_is_twenty_invoices() -> None:
    assert len(MANIFEST) == 20
    assert sorted(p.name for p in HELDOUT.glob("*.txt")) == sorted(e["file"] for e in MANIFEST)


if __name__ == "__main__":
    print(report(HELDOUT, "held-out"))
