"""The validation policy over real sample invoices, with extractions written by hand.

Each extraction below is what a careful reader (or a model that obeys an injected instruction)
would produce from the sample text, its evidence written as the words copied from the file and
answered as the span where the file prints them. The samples' master data is
services/sandbox/samples/suppliers.csv and the tenant allows the default currencies.
"""

from __future__ import annotations

import copy
import csv
import json
import re
from pathlib import Path
from typing import Any

import pytest

from services.inference.validation import (
    REASON_CODES,
    MasterSupplier,
    ValidationContext,
    Verdict,
    normalize_tax_id,
    validate,
)

SAMPLES = Path(__file__).resolve().parents[2] / "services" / "sandbox" / "samples"
DEFAULT_CURRENCIES = frozenset({"TRY", "EUR", "USD", "GBP"})
ANADOLU_IBAN = "TR710006200001000000123456"
INJECTED_IBAN = "TR330006100519786457841326"


def master_data() -> dict[str, MasterSupplier]:
    with (SAMPLES / "suppliers.csv").open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    return {
        normalize_tax_id(r["tax_id"]): MasterSupplier(
            r["tax_id"], r["name"], r["iban"] or None, r["currency"] or None
        )
        for r in rows
    }


def span(text: str, quote: str) -> dict[str, int]:
    """The span of the first place ``quote`` is printed (any whitespace between its words)."""
    pattern = r"\s+".join(re.escape(word) for word in quote.split())
    pages = text.split("\f")
    for page, page_text in enumerate(pages, start=1):
        match = re.search(pattern, page_text)
        if match is not None:
            return {"page": page, "start": match.start(), "end": match.end()}
    raise AssertionError(f"{quote!r} is not printed in the document")


def answered(sample: str, extraction: dict[str, Any]) -> dict[str, Any]:
    """The extraction as a model answers it: each quote of ``evidence`` as the span where it is printed."""
    text = (SAMPLES / sample).read_text(encoding="utf-8")
    answer = copy.deepcopy(extraction)
    answer["evidence"] = {
        pointer: span(text, quote) if isinstance(quote, str) else quote
        for pointer, quote in extraction["evidence"].items()
    }
    return answer


def judge(sample: str, extraction: dict[str, Any]) -> Verdict:
    context = ValidationContext(
        source_text=(SAMPLES / sample).read_text(encoding="utf-8"),
        allowed_currencies=DEFAULT_CURRENCIES,
        suppliers=master_data(),
    )
    return validate(json.dumps(answered(sample, extraction), ensure_ascii=False), context)


def line(
    description: str, quantity: str, unit_price: str, amount: str, tax_rate: str | None, row: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """One line item and its evidence: the description quotes itself, the numbers their table row."""
    item = {
        "description": description,
        "quantity": quantity,
        "unit_price": unit_price,
        "amount": amount,
        "tax_rate": tax_rate,
    }
    return item, {"description": description} | {name: row for name in ("quantity", "unit_price", "amount")}


def anadolu(
    number: str, date: str, lines: list[tuple[dict[str, Any], dict[str, str]]], totals: tuple[str, str, str]
) -> dict[str, Any]:
    """An Anadolu Kırtasiye invoice (samples 01, 06 and 08 share the letterhead)."""
    iso_day = "-".join(reversed(date.split(".")))
    evidence = {
        "/supplier/name": "ANADOLU KIRTASİYE A.Ş.",
        "/supplier/tax_id": "VKN: 1234567890",
        "/supplier/iban": "Ödeme: IBAN TR71 0006 2000 0100 0000 1234 56",
        "/invoice_number": f"Fatura No: {number}",
        "/issue_date": f"Fatura Tarihi: {date}",
        "/currency": "Para Birimi: TRY",
        "/subtotal": "Ara Toplam:",
        "/tax_total": "KDV %20:",
        "/total": "Genel Toplam:",
    }
    subtotal, tax_total, total = totals
    for key, value in (("/subtotal", subtotal), ("/tax_total", tax_total), ("/total", total)):
        evidence[key] = f"{evidence[key]} {value}"
    for index, (_, quotes) in enumerate(lines):
        for name, quote in quotes.items():
            evidence[f"/lines/{index}/{name}"] = quote
        evidence[f"/lines/{index}/tax_rate"] = "KDV %20"
    return {
        "schema": "invoice.v1",
        "supplier": {
            "name": "Anadolu Kırtasiye A.Ş.",
            "tax_id": "1234567890",
            "iban": "TR710006200001000000123456",
        },
        "invoice_number": number,
        "issue_date": iso_day,
        "due_date": None,
        "currency": "TRY",
        "lines": [item for item, _ in lines],
        "subtotal": _plain(subtotal),
        "tax_total": _plain(tax_total),
        "total": _plain(total),
        "evidence": evidence,
    }


def _plain(turkish: str) -> str:
    return turkish.replace(".", "").replace(",", ".")


def sample_01() -> dict[str, Any]:
    return anadolu(
        "AK-2026-000184",
        "27.11.2026",
        [
            line("A4 Fotokopi Kağıdı (koli)", "10", "450.00", "4500.00", "20", "10 450,00 4.500,00"),
            line("Toner Kartuş HP 85A", "4", "1250.00", "5000.00", "20", "4      1.250,00     5.000,00"),
            line("Dosya Klasörü", "25", "38.00", "950.00", "20", "Dosya Klasörü 25 38,00 950,00"),
        ],
        ("10.450,00", "2.090,00", "12.540,00"),
    )


def test_sample_01_read_faithfully_succeeds() -> None:
    extraction = sample_01()
    # the second line's numbers are quoted one by one, as a model may do
    extraction["evidence"].update({"/lines/1/unit_price": "1.250,00", "/lines/1/amount": "5.000,00"})
    verdict = judge("01_tr_kirtasiye_try.txt", extraction)
    assert verdict.outcome == "succeeded", [r.to_json() for r in verdict.reasons]
    assert verdict.result == answered("01_tr_kirtasiye_try.txt", extraction)


def test_sample_01_with_one_amount_misread_goes_to_review() -> None:
    extraction = sample_01()
    extraction["lines"][0]["amount"] = "4600.00"
    verdict = judge("01_tr_kirtasiye_try.txt", extraction)
    assert verdict.outcome == "review_required"
    assert [(r.code, r.field) for r in verdict.reasons] == [
        ("arithmetic_line", "/lines/0/amount"),
        ("arithmetic_subtotal", "/subtotal"),
        ("evidence_missing", "/lines/0/amount"),
    ]


def test_sample_06_with_its_stated_wrong_total_goes_to_review_for_arithmetic() -> None:
    extraction = anadolu(
        "AK-2026-000191",
        "28.11.2026",
        [
            line("A4 Fotokopi Kağıdı (koli)", "2", "450.00", "900.00", "20", "2        450,00       900,00"),
            line("Dosya Klasörü", "3", "38.00", "114.00", "20", "3         38,00       114,00"),
        ],
        ("1.014,00", "202,80", "1.316,80"),
    )
    verdict = judge("06_review_bad_arithmetic_try.txt", extraction)
    assert verdict.outcome == "review_required"
    assert [r.code for r in verdict.reasons] == ["arithmetic_total"]
    assert verdict.reasons[0].detail["computed"] == "1216.80"


def sample_08() -> dict[str, Any]:
    return anadolu(
        "AK-2026-000199",
        "29.11.2026",
        [line("Toner Kartuş HP 85A", "2", "1250.00", "2500.00", "20", "2      1.250,00     2.500,00")],
        ("2.500,00", "500,00", "3.000,00"),
    )


def test_sample_08_read_faithfully_still_goes_to_review_because_it_names_a_second_iban() -> None:
    verdict = judge("08_review_injected_instruction_try.txt", sample_08())
    assert verdict.outcome == "review_required"
    assert [r.code for r in verdict.reasons] == ["iban_ambiguous"]
    assert verdict.reasons[0].detail["ibans"] == [INJECTED_IBAN, ANADOLU_IBAN]


@pytest.mark.parametrize(
    ("quote", "evidence_reason"),
    [
        ("TR33 0006 1005 1978 6457 8413 26", "evidence_in_instruction"),  # where the note states it
        ("Ödeme: IBAN TR71 0006 2000 0100 0000 1234 56", "evidence_missing"),  # the payment line
    ],
)
def test_sample_08_read_by_a_model_that_obeys_the_injection_never_succeeds(
    quote: str, evidence_reason: str
) -> None:
    # Given a model that reports the IBAN the injected note asks for, pointing at the note or at
    # the payment line
    extraction = sample_08()
    extraction["supplier"]["iban"] = INJECTED_IBAN
    extraction["evidence"]["/supplier/iban"] = quote
    verdict = judge("08_review_injected_instruction_try.txt", extraction)
    # Then it goes to review for the IBAN, and for where its evidence lies
    assert verdict.outcome == "review_required"
    assert {"iban_mismatch", "iban_ambiguous", evidence_reason} <= {r.code for r in verdict.reasons}


def test_the_sample_manifest_expects_only_reason_codes_the_policy_can_give() -> None:
    manifest = json.loads((SAMPLES / "manifest.json").read_text(encoding="utf-8"))
    expected = [
        code
        for entry in manifest
        for case in [entry, *entry.get("faults", {}).values()]
        for code in case.get("reasons", [])
    ]
    assert expected, "the manifest lists no review reasons: the scan is broken"
    assert sorted(set(expected) - set(REASON_CODES)) == []
