"""The simulated provider measured on invoices it was not written against (the held-out set).

``services/sandbox/samples/heldout/`` holds twenty invoices and a manifest of what each states. An
invoice *extracts fully* when the simulator's answer is schema-valid, every field the manifest
names equals what the document states, and validation (the tenant's master data knowing the
supplier) ends it in the manifest's state with its reasons, so every span is right too.

Run this file to print the figure: ``.venv/bin/python tests/unit/test_sandbox_heldout.py``.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from services.inference.validation import MasterSupplier, ValidationContext, normalize_tax_id, validate
from services.inference.validation._money import within
from services.inference.validation._parties import compact_iban
from services.sandbox.provider.extract import extract

HELDOUT = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "samples" / "heldout"
MANIFEST: list[dict[str, Any]] = json.loads((HELDOUT / "manifest.json").read_text(encoding="utf-8"))
STATE = {"succeeded": "SUCCEEDED", "review_required": "REVIEW_REQUIRED", "model_error": "FAILED"}


@dataclass(frozen=True)
class Score:
    file: str
    schema_valid: bool
    wrong: tuple[str, ...]  # the fields whose value differs from what the document states
    state: str
    reasons: tuple[str, ...]
    error: str | None  # why the answer is no invoice.v1, when it is not

    @property
    def full(self) -> bool:
        entry = _entry(self.file)
        return (
            self.schema_valid
            and not self.wrong
            and (self.state, sorted(self.reasons)) == (entry["expect"], sorted(entry["reasons"]))
        )


def _entry(file: str) -> dict[str, Any]:
    return next(entry for entry in MANIFEST if entry["file"] == file)


def _context(text: str) -> ValidationContext:
    suppliers = {
        normalize_tax_id(e["supplier"]["tax_id"]): MasterSupplier(
            e["supplier"]["tax_id"], e["supplier"]["name"], e["supplier"]["iban"], e["currency"]
        )
        for e in MANIFEST
    }
    return ValidationContext(text, frozenset(e["currency"] for e in MANIFEST), suppliers)


def _same_number(got: Any, stated: str) -> bool:
    try:
        return got is not None and Decimal(str(got)) == Decimal(stated)
    except ArithmeticError:
        return False


def _wrong_fields(entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
    supplier = answer.get("supplier") or {}
    tax_id, iban = supplier.get("tax_id"), supplier.get("iban")
    checks = {
        "supplier.tax_id": normalize_tax_id(str(tax_id or ""))
        == normalize_tax_id(entry["supplier"]["tax_id"]),
        "supplier.iban": (compact_iban(iban) if iban else None) == entry["supplier"]["iban"],
        **{name: answer.get(name) == entry[name] for name in ("invoice_number", "issue_date", "due_date")},
        "currency": answer.get("currency") == entry["currency"],
        **{name: _same_number(answer.get(name), entry[name]) for name in ("subtotal", "tax_total", "total")},
    }
    wrong = [name for name, ok in checks.items() if not ok]
    lines = answer.get("lines") or []
    got = [tuple(line.get(k) for k in ("quantity", "unit_price", "amount")) for line in lines]
    if len(got) != len(entry["lines"]):
        wrong.append(f"lines ({len(got)} of {len(entry['lines'])})")
    else:
        wrong += [
            f"lines/{index}"
            for index, (row, stated) in enumerate(zip(got, entry["lines"], strict=True))
            if not all(_same_number(value, want) for value, want in zip(row, stated, strict=True))
        ]
    return wrong


def score(entry: dict[str, Any]) -> Score:
    text = (HELDOUT / entry["file"]).read_text(encoding="utf-8")
    answer = extract(text)
    verdict = validate(json.dumps(answer, ensure_ascii=False), _context(text))
    return Score(
        file=entry["file"],
        schema_valid=verdict.outcome != "model_error",
        wrong=tuple(_wrong_fields(entry, answer)),
        state=STATE[verdict.outcome],
        reasons=tuple(verdict.review_codes),
        error=verdict.error_message,
    )


def report() -> str:
    scores = [score(entry) for entry in MANIFEST]
    rows = [
        f"{'ok  ' if s.full else 'FAIL'} {s.file:42} {s.state:15} {','.join(s.reasons) or '-':28} "
        f"{'wrong: ' + ', '.join(s.wrong) if s.wrong else ''}{'; ' + s.error if s.error else ''}"
        for s in scores
    ]
    valid = sum(s.schema_valid for s in scores)
    full = sum(s.full for s in scores)
    rows.append(
        f"held-out: {full}/{len(scores)} extract fully and end as their manifest says; "
        f"{valid}/{len(scores)} schema-valid"
    )
    return "\n".join(rows)


# --- the held-out manifest itself is right: its figures add up and the documents state them ---


@pytest.mark.parametrize("entry", MANIFEST, ids=lambda e: e["file"])
def test_each_heldout_manifest_entry_adds_up(entry: dict[str, Any]) -> None:
    currency = entry["currency"]
    amounts = [Decimal(a) for _, _, a in entry["lines"]]
    assert all(within(Decimal(a), Decimal(q) * Decimal(p), currency) for q, p, a in entry["lines"]), entry[
        "file"
    ]
    assert Decimal(entry["subtotal"]) == sum(amounts, Decimal(0))
    assert Decimal(entry["subtotal"]) + Decimal(entry["tax_total"]) == Decimal(entry["total"])
    assert (HELDOUT / entry["file"]).is_file()


def test_the_heldout_set_is_twenty_invoices() -> None:
    assert len(MANIFEST) == 20
    assert sorted(p.name for p in HELDOUT.glob("*.txt")) == sorted(e["file"] for e in MANIFEST)


if __name__ == "__main__":
    print(report())
    sys.exit(0)
