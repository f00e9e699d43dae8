"""The sample invoices shipped with the project, and the supplier master data they refer to.

``manifest.json`` gives each sample the final state a correct pipeline reaches with an honest
provider (``expect``), why, the review reason codes validation must give (``reasons``), and, for
samples built for a provider fault, what the pipeline must end in under that fault (``faults``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SAMPLES_DIR = Path(__file__).with_name("samples")
SUPPLIERS_CSV = SAMPLES_DIR / "suppliers.csv"


@dataclass(frozen=True)
class FaultExpectation:
    expect: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Sample:
    filename: str
    text: str
    expect: str  # the state a correct pipeline ends in: SUCCEEDED or REVIEW_REQUIRED
    why: str
    reasons: tuple[str, ...] = ()  # review reason codes, when expect is REVIEW_REQUIRED
    # simulated provider fault mode -> the outcome under it (only for samples built for one)
    faults: dict[str, FaultExpectation] = field(default_factory=dict)


def load_samples() -> list[Sample]:
    manifest: list[dict[str, Any]] = json.loads((SAMPLES_DIR / "manifest.json").read_text(encoding="utf-8"))
    return [
        Sample(
            filename=entry["file"],
            text=(SAMPLES_DIR / entry["file"]).read_text(encoding="utf-8"),
            expect=entry["expect"],
            why=entry["why"],
            reasons=tuple(entry.get("reasons", ())),
            faults={
                mode: FaultExpectation(outcome["expect"], tuple(outcome.get("reasons", ())))
                for mode, outcome in entry.get("faults", {}).items()
            },
        )
        for entry in manifest
    ]
