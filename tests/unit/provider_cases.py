"""Scoring the simulated provider on a folder of invoices with a manifest of what each states.

A folder holds ``*.txt`` invoices and ``manifest.json``: per file the supplier (tax id, IBAN), the
invoice number, issue and due date, currency, every line as ``[quantity, unit_price, amount]``,
subtotal, tax total, total, and the state validation reaches (``expect``, ``reasons``) when the
tenant's master data knows every supplier of the folder. An invoice *extracts fully* when the
answer is schema-valid, every field equals what the document states, and validation ends it as
the manifest says (so every evidence span is right too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from services.inference.validation import MasterSupplier, ValidationContext, normalize_tax_id, validate
from services.inference.validation._money import within
from services.inference.validation._parties import compact_iban
from services.sandbox.provider.extract import extract

STATE = {"succeeded": "SUCCEEDED", "review_required": "REVIEW_REQUIRED", "model_error": "FAILED"}


def load_manifest(folder: Path) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return entries


@dataclass(frozen=True)
class Score:
    file: str
    schema_valid: bool
    wrong: tuple[str, ...]  # the fields whose value differs from what the document states
    state: str
    reasons: tuple[str, ...]
    error: str | None  # why the answer is no invoice.v1, when it is not
    expected: tuple[str, tuple[str, ...]]  # the manifest's state and reasons

    @property
    def full(self) -> bool:
        return (
            self.schema_valid
            and not self.wrong
            and (self.state, tuple(sorted(self.reasons))) == self.expected
        )


def context_for(entries: list[dict[str, Any]], text: str) -> ValidationContext:
    """A tenant whose master data knows every supplier of the folder and allows its currencies."""
    suppliers = {
        normalize_tax_id(e["supplier"]["tax_id"]): MasterSupplier(
            e["supplier"]["tax_id"], e["supplier"]["name"], e["supplier"]["iban"], e["currency"]
        )
        for e in entries
    }
    return ValidationContext(text, frozenset(e["currency"] for e in entries), suppliers)


def _same_number(got: Any, stated: str) -> bool:
    try:
        return got is not None and Decimal(str(got)) == Decimal(stated)
    except ArithmeticError:
        return False


def wrong_fields(entry: dict[str, Any], answer: dict[str, Any]) -> list[str]:
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


def score(folder: Path, entries: list[dict[str, Any]], entry: dict[str, Any]) -> Score:
    text = (folder / entry["file"]).read_text(encoding="utf-8")
    answer = extract(text)
    verdict = validate(json.dumps(answer, ensure_ascii=False), context_for(entries, text))
    return Score(
        file=entry["file"],
        schema_valid=verdict.outcome != "model_error",
        wrong=tuple(wrong_fields(entry, answer)),
        state=STATE[verdict.outcome],
        reasons=tuple(verdict.review_codes),
        error=verdict.error_message,
        expected=(entry["expect"], tuple(sorted(entry["reasons"]))),
    )


def score_all(folder: Path) -> list[Score]:
    entries = load_manifest(folder)
    return [score(folder, entries, entry) for entry in entries]


def report(folder: Path, name: str) -> str:
    """One row per invoice, then the figure."""
    scores = score_all(folder)
    rows = [
        f"{'ok  ' if s.full else 'FAIL'} {s.file:42} {s.state:15} {','.join(s.reasons) or '-':28} "
        f"{'wrong: ' + ', '.join(s.wrong) if s.wrong else ''}{'; ' + s.error if s.error else ''}"
        for s in scores
    ]
    valid = sum(s.schema_valid for s in scores)
    full = sum(s.full for s in scores)
    rows.append(
        f"{name}: {full}/{len(scores)} extract fully and end as their manifest says; "
        f"{valid}/{len(scores)} schema-valid"
    )
    return "\n".join(rows)


def manifest_problems(folder: Path, entry: dict[str, Any]) -> list[str]:
    """What does not add up in one manifest entry (a line stated wrong on purpose is allowed when
    the entry expects ``arithmetic_line``)."""
    problems = []
    currency = entry["currency"]
    if "arithmetic_line" not in entry["reasons"]:
        problems += [
            f"line {q} x {p} != {a}"
            for q, p, a in entry["lines"]
            if not within(Decimal(a), Decimal(q) * Decimal(p), currency)
        ]
    if Decimal(entry["subtotal"]) != sum((Decimal(a) for _, _, a in entry["lines"]), Decimal(0)):
        problems.append("the subtotal is not the sum of the lines")
    if Decimal(entry["subtotal"]) + Decimal(entry["tax_total"]) != Decimal(entry["total"]):
        problems.append("subtotal + tax is not the total")
    if not (folder / entry["file"]).is_file():
        problems.append("no such file")
    return problems
