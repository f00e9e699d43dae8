"""The sample invoices shipped with the project, and the supplier master data they refer to."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SAMPLES_DIR = Path(__file__).with_name("samples")
SUPPLIERS_CSV = SAMPLES_DIR / "suppliers.csv"


@dataclass(frozen=True)
class Sample:
    filename: str
    text: str
    expect: str  # the state a correct pipeline ends in: SUCCEEDED or REVIEW_REQUIRED
    why: str


def load_samples() -> list[Sample]:
    manifest = json.loads((SAMPLES_DIR / "manifest.json").read_text(encoding="utf-8"))
    return [
        Sample(
            filename=entry["file"],
            text=(SAMPLES_DIR / entry["file"]).read_text(encoding="utf-8"),
            expect=entry["expect"],
            why=entry["why"],
        )
        for entry in manifest
    ]
