"""Properties of the validation policy over generated invoices (hypothesis).

Arithmetic: a stated figure exactly at the tolerance (half a minor unit per rounding step) passes,
one millionth beyond it fails, for random decimals and currencies with 0, 2 and 3 minor digits.
IBAN: every IBAN built with the ISO 13616 algorithm passes; any single-character substitution and
any adjacent transposition of it fails. Expected values come from this file's own reading of the
standards, not from the code under test.
"""

from __future__ import annotations

import json
import string
from decimal import Decimal
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from services.inference.validation import MasterSupplier, ValidationContext, Verdict, validate

MINOR_DIGITS = {"JPY": 0, "KRW": 0, "TRY": 2, "EUR": 2, "USD": 2, "KWD": 3, "BHD": 3}
EPSILON = Decimal("0.000001")  # the smallest step a schema decimal can take
TAX_ID = "1112223334"
PROPERTIES = settings(max_examples=150, deadline=None)


def half_unit(currency: str) -> Decimal:
    return Decimal("0.5") * Decimal(10) ** -MINOR_DIGITS[currency]


def text(value: Decimal) -> str:
    return format(value, "f")


def judge(invoice: dict[str, Any], currency: str, iban: str | None = None) -> Verdict:
    context = ValidationContext(
        source_text="",
        allowed_currencies=frozenset(MINOR_DIGITS),
        suppliers={TAX_ID: MasterSupplier(TAX_ID, "Kuzey", iban, currency)},
    )
    return validate(json.dumps(invoice), context)


def invoice(
    currency: str,
    lines: list[tuple[Decimal, Decimal, Decimal]],
    subtotal: Decimal,
    tax: Decimal,
    total: Decimal,
) -> dict[str, Any]:
    return {
        "schema": "invoice.v1",
        "supplier": {"name": "Kuzey", "tax_id": TAX_ID, "iban": None},
        "invoice_number": "1",
        "issue_date": "2026-03-05",
        "due_date": None,
        "currency": currency,
        "lines": [
            {
                "description": "x",
                "quantity": text(q),
                "unit_price": text(p),
                "amount": text(a),
                "tax_rate": None,
            }
            for q, p, a in lines
        ],
        "subtotal": text(subtotal),
        "tax_total": text(tax),
        "total": text(total),
        "evidence": {},
    }


def codes(verdict: Verdict) -> set[str]:
    """The reason codes, less ``evidence_missing``: these invoices come without a source text."""
    assert verdict.outcome != "model_error", verdict.error_message
    return {reason.code for reason in verdict.reasons} - {"evidence_missing"}


currencies = st.sampled_from(sorted(MINOR_DIGITS))
signs = st.sampled_from([Decimal(1), Decimal(-1)])


@st.composite
def decimals(draw: st.DrawFn, max_places: int = 3) -> Decimal:
    places = draw(st.integers(0, max_places))
    return Decimal(draw(st.integers(1, 9_999_999))).scaleb(-places)


@PROPERTIES
@given(currency=currencies, quantity=decimals(), unit_price=decimals(), sign=signs)
def test_a_line_amount_holds_exactly_up_to_half_a_minor_unit(
    currency: str, quantity: Decimal, unit_price: Decimal, sign: Decimal
) -> None:
    product = quantity * unit_price
    for amount, holds in (
        (product + sign * half_unit(currency), True),
        (product + sign * (half_unit(currency) + EPSILON), False),
    ):
        verdict = judge(
            invoice(currency, [(quantity, unit_price, amount)], amount, Decimal(0), amount), currency
        )
        assert ("arithmetic_line" in codes(verdict)) is not holds


@PROPERTIES
@given(
    currency=currencies,
    lines=st.lists(st.tuples(decimals(), decimals()), min_size=1, max_size=6),
    sign=signs,
)
def test_a_subtotal_holds_exactly_up_to_half_a_minor_unit_per_line(
    currency: str, lines: list[tuple[Decimal, Decimal]], sign: Decimal
) -> None:
    rows = [(q, p, q * p) for q, p in lines]
    lines_sum = sum((a for _, _, a in rows), Decimal(0))
    allowed = half_unit(currency) * len(rows)
    for subtotal, holds in (
        (lines_sum + sign * allowed, True),
        (lines_sum + sign * (allowed + EPSILON), False),
    ):
        verdict = judge(invoice(currency, rows, subtotal, Decimal(0), subtotal), currency)
        assert ("arithmetic_subtotal" in codes(verdict)) is not holds
        assert "arithmetic_line" not in codes(verdict)


@PROPERTIES
@given(currency=currencies, amount=decimals(), tax=decimals(), sign=signs)
def test_a_total_holds_exactly_up_to_one_minor_unit_for_its_two_rounded_parts(
    currency: str, amount: Decimal, tax: Decimal, sign: Decimal
) -> None:
    row = [(Decimal(1), amount, amount)]
    allowed = 2 * half_unit(currency)
    for total, holds in (
        (amount + tax + sign * allowed, True),
        (amount + tax + sign * (allowed + EPSILON), False),
    ):
        verdict = judge(invoice(currency, row, amount, tax, total), currency)
        assert codes(verdict) == (set() if holds else {"arithmetic_total"})


# Countries whose BBAN is letters and digits in fixed places (no national check digit of its own),
# so only ISO 13616 decides validity.
BBAN_FORMATS = {
    "DE": "n" * 18,
    "AT": "n" * 16,
    "PL": "n" * 24,
    "FI": "n" * 14,
    "HU": "n" * 24,
    "SE": "n" * 20,
    "AE": "n" * 19,
    "GB": "aaaa" + "n" * 14,
    "IE": "aaaa" + "n" * 14,
    "NL": "aaaa" + "n" * 10,
}
ALPHABET = {"a": string.ascii_uppercase, "n": string.digits}


def iso13616_check_digits(country: str, bban: str) -> str:
    """ISO 13616: move country + '00' to the end, letters to 10..35, check = 98 - n mod 97."""
    numeric = "".join(str(int(c, 36)) for c in bban + country + "00")
    return f"{98 - int(numeric) % 97:02d}"


@st.composite
def valid_ibans(draw: st.DrawFn) -> str:
    country = draw(st.sampled_from(sorted(BBAN_FORMATS)))
    bban = "".join(draw(st.sampled_from(ALPHABET[kind])) for kind in BBAN_FORMATS[country])
    return country + iso13616_check_digits(country, bban) + bban


def iban_verdict(iban: str) -> Verdict:
    row = [(Decimal(1), Decimal(1), Decimal(1))]
    answer = invoice("EUR", row, Decimal(1), Decimal(0), Decimal(1))
    answer["supplier"]["iban"] = iban
    return judge(answer, "EUR", iban=iban)


@PROPERTIES
@given(iban=valid_ibans())
def test_every_iban_built_by_iso_13616_passes_the_checksum_rule(iban: str) -> None:
    assert codes(iban_verdict(iban)) == set()


@PROPERTIES
@given(iban=valid_ibans(), data=st.data())
def test_any_single_character_substitution_fails_the_checksum_rule(iban: str, data: st.DataObject) -> None:
    index = data.draw(st.integers(0, len(iban) - 1))
    kind = string.digits if iban[index].isdigit() else string.ascii_uppercase
    replacement = data.draw(st.sampled_from([c for c in kind if c != iban[index]]))
    changed = iban[:index] + replacement + iban[index + 1 :]
    assert "iban_checksum" in codes(iban_verdict(changed))


@PROPERTIES
@given(iban=valid_ibans(), data=st.data())
def test_any_adjacent_transposition_fails(iban: str, data: st.DataObject) -> None:
    candidates = [i for i in range(len(iban) - 1) if iban[i] != iban[i + 1]]
    index = data.draw(st.sampled_from(candidates))
    swapped = iban[:index] + iban[index + 1] + iban[index] + iban[index + 2 :]
    verdict = iban_verdict(swapped)
    # A letter swapped into the check digits breaks the schema itself: a model error, never a success.
    assert verdict.outcome == "model_error" or "iban_checksum" in codes(verdict)


@PROPERTIES
@given(iban=valid_ibans(), data=st.data())
def test_an_iban_judged_again_gets_its_own_verdict_again(iban: str, data: st.DataObject) -> None:
    # The ISO 13616 check is remembered per IBAN: judged in turn with a one-character substitution
    # of itself, each keeps its own verdict.
    index = data.draw(st.integers(4, len(iban) - 1))
    kind = string.digits if iban[index].isdigit() else string.ascii_uppercase
    changed = (
        iban[:index] + data.draw(st.sampled_from([c for c in kind if c != iban[index]])) + iban[index + 1 :]
    )
    for _ in range(3):
        assert codes(iban_verdict(iban)) == set()
        assert "iban_checksum" in codes(iban_verdict(changed))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@PROPERTIES
@given(content=st.text() | json_values.map(json.dumps))
def test_any_answer_at_all_gets_a_verdict_never_an_exception(content: str) -> None:
    verdict = judge_raw(content, source_text="")
    assert verdict.outcome == "model_error" and verdict.error_class in {"broken_json", "schema_violation"}


spans = st.fixed_dictionaries(
    {"page": st.integers(-1, 4), "start": st.integers(-2, 80), "end": st.integers(-2, 80)}
)


@PROPERTIES
@given(
    source_text=st.text(),
    evidence=st.lists(spans, min_size=4, max_size=4),
    name=st.text(min_size=1, max_size=40).filter(str.strip),
)
def test_any_document_and_any_spans_get_a_verdict_never_an_exception(
    source_text: str, evidence: list[dict[str, int]], name: str
) -> None:
    row = [(Decimal(2), Decimal("1.5"), Decimal(3))]
    answer = invoice("TRY", row, Decimal(3), Decimal(0), Decimal(3))
    answer["supplier"]["name"] = answer["lines"][0]["description"] = name
    pointers = ["/supplier/name", "/issue_date", "/lines/0/amount", "/currency"]
    answer["evidence"] = dict(zip(pointers, evidence, strict=True))
    verdict = judge_raw(json.dumps(answer), source_text=source_text)
    assert verdict.outcome in {"succeeded", "review_required", "model_error"}
    if verdict.outcome == "review_required":
        assert {r.code for r in verdict.reasons} <= {"evidence_missing", "evidence_in_instruction"}


def judge_raw(content: str, source_text: str) -> Verdict:
    context = ValidationContext(
        source_text=source_text,
        allowed_currencies=frozenset({"TRY"}),
        suppliers={TAX_ID: MasterSupplier(TAX_ID, "Kuzey", None, "TRY")},
    )
    return validate(content, context)
