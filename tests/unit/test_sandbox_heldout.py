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
from provider_cases import load_manifest, manifest_problems, report, score_all

HELDOUT = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "samples" / "heldout"
MANIFEST = load_manifest(HELDOUT)


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e["file"])
def test_each_heldout_manifest_entry_adds_up(entry: dict[str, Any]) -> None:
    assert manifest_problems(HELDOUT, entry) == []


def test_the_heldout_set_is_twenty_invoices() -> None:
    assert len(MANIFEST) == 20
    assert sorted(p.name for p in HELDOUT.glob("*.txt")) == sorted(e["file"] for e in MANIFEST)


# Measured once, after the extractor was developed on provider_dev_cases/ (before: 0 of 20 extracted
# fully, 0 of 20 schema-valid). What the extractor misses here, and why; these were not fixed
# after they were seen, so the figure stays a measurement:
KNOWN_MISSES = {
    "h01_tr_makina_toplam_try.txt": "the tax id's label 'V.No' is not a label the extractor knows, so the "
    "tax id is null and the answer violates the schema",
    "h02_tr_kalibrasyon_kasim_try.txt": "'Son Ödeme:' (without 'Tarihi') is no due date label: due date null",
    "h08_fr_papeterie_times_eur.txt": "'TVA : FR 27 523456789' is a tax id under a bare 'TVA' label, which "
    "the extractor does not take as one (schema violation); the due date is only in a sentence "
    "('À régler avant le ...')",
    "h12_nl_koffie_two_pages_eur.txt": "'Betalen vóór:' is no due date label: due date null",
    "h13_it_ferramenta_qta_eur.txt": "'Scadenza pagamento:' is no due date label ('Scadenza' is, but the "
    "date must open its value): due date null",
    "h18_at_grafik_kleinunternehmer_eur.txt": "'Zahlungsziel:' is no due date label: due date null",
}
FULL_FLOOR = 14  # of 20 extract fully and end as their manifest says
SCHEMA_VALID_FLOOR = 18  # of 20 answer schema-valid invoice.v1 (the other two end FAILED_TERMINAL)


def test_the_extractor_reads_held_out_invoices_it_was_not_written_against() -> None:
    scores = score_all(HELDOUT)
    missed = {s.file for s in scores if not s.full}
    assert sum(s.full for s in scores) >= FULL_FLOOR, report(HELDOUT, "held-out")
    assert sum(s.schema_valid for s in scores) >= SCHEMA_VALID_FLOOR, report(HELDOUT, "held-out")
    assert missed <= set(KNOWN_MISSES), report(HELDOUT, "held-out")


if __name__ == "__main__":
    print(report(HELDOUT, "held-out"))
