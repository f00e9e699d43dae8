"""The simulated provider's rule-based extraction, read against every sample invoice.

Given a sample's text, when the simulator extracts it, then the answer is invoice.v1, every
evidence span names the piece of the text its value was read from, and the numbers are the ones the
document states (right or wrong).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from stdnum import iban as stdnum_iban

from services.inference.validation import instruction_passages, resolve_span, split_pages
from services.inference.validation._evidence import evidence_reasons
from services.sandbox.provider.dates import find_date
from services.sandbox.provider.extract import extract
from services.sandbox.provider.faults import broken_json, hallucinate_iban, obey_injection
from services.sandbox.provider.numbers import detect_style, parse_number
from services.sandbox.samples import load_samples

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads(
    (ROOT / "services/inference/validation/invoice.v1.schema.json").read_text(encoding="utf-8")
)
VALIDATOR = Draft202012Validator(SCHEMA)
SAMPLES = {s.filename: s for s in load_samples()}

# sample number -> "invoice number|issue date|due date|currency|iban|lines|subtotal|tax|total",
# copied by hand from the documents ("-" is null).
STATED_ROWS = {
    "01": "AK-2026-000184|2026-11-27|-|TRY|TR710006200001000000123456|3|10450.00|2090.00|12540.00",
    "02": "RE-55120|2026-11-24|-|EUR|DE89370400440532013000|2|714.50|135.76|850.26",
    "03": "PS-90311|2026-11-20|-|USD|-|3|938.40|77.42|1015.82",
    "04": "TO-7781|2026-11-18|-|GBP|GB29NWBK60161331926819|2|588.00|117.60|705.60",
    "05": "EG-2026-3321|2026-11-25|-|TRY|TR260001000201234567890123|3|28350.00|2835.00|31185.00",
    "06": "AK-2026-000191|2026-11-28|-|TRY|TR710006200001000000123456|2|1014.00|202.80|1316.80",
    "07": "KY-000077|2026-11-26|-|TRY|TR290006400000112345678901|1|7400.00|1480.00|8880.00",
    "08": "AK-2026-000199|2026-11-29|-|TRY|TR710006200001000000123456|1|2500.00|500.00|3000.00",
    "09": "SK-4410|2026-11-21|-|JPY|-|1|48000|4800|52800",
    "10": "RE-55133|2026-11-28|-|EUR|DE88370400440532013000|1|199.00|37.81|236.81",
    "11": "PR-2026-1187|2026-11-26|2026-12-26|EUR|FR7630006000011234567890189|4|1904.60|380.92|2285.52",
    "12": "MB-2026-118|2026-11-25|2026-12-31|JPY|-|3|36560|3656|40216",
    "13": "RLS-44817|2026-11-27|2026-12-27|USD|-|10|3594.42|260.60|3855.02",
    "14": "LPD-2611|2026-11-23|2026-12-23|EUR|-|2|518.00|119.14|637.14",
    "15": "RE-55187|2026-11-30|-|EUR|DE89370400440532013000|1|1240.00|235.60|1475.60",
}
STATED: dict[str, tuple[Any, ...]] = {
    name: tuple(
        None if v == "-" else int(v) if v.isdigit() and i == 5 else v for i, v in enumerate(row.split("|"))
    )
    for name in SAMPLES
    for number, row in STATED_ROWS.items()
    if name.startswith(f"{number}_")
}


def _scalars(value: Any, pointer: str = "") -> dict[str, Any]:
    """Every scalar field of the answer by JSON Pointer (evidence itself excluded)."""
    if isinstance(value, dict):
        return {
            k: v
            for key, item in value.items()
            if key != "evidence"
            for k, v in _scalars(item, f"{pointer}/{key}").items()
        }
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in _scalars(item, f"{pointer}/{i}").items()}
    return {pointer: value}


def test_there_are_at_least_fifteen_samples_and_each_is_described() -> None:
    assert len(SAMPLES) >= 15
    assert set(STATED) == set(SAMPLES)


@pytest.mark.parametrize("filename", sorted(STATED))
def test_every_sample_extracts_to_schema_valid_invoice_with_spans_stating_each_value(filename: str) -> None:
    # Given a sample invoice, when the simulator extracts it
    text = SAMPLES[filename].text
    result = extract(text)

    # Then the answer is invoice.v1
    assert sorted(VALIDATOR.iter_errors(result), key=str) == []
    # And every non-null scalar field has a span, and every span names text that states its value
    fields = {p: v for p, v in _scalars(result).items() if v is not None and p != "/schema"}
    assert sorted(result["evidence"]) == sorted(fields)
    for pointer, span in result["evidence"].items():
        assert resolve_span(text, span), f"{pointer}: {span} names no text"
    assert [r.to_json() for r in evidence_reasons(result, text) if r.code == "evidence_missing"] == []


def _read(text: str, result: dict[str, Any], pointer: str) -> str | None:
    return resolve_span(text, result["evidence"][pointer])


def test_spans_on_later_pages_count_from_the_start_of_their_page() -> None:
    # Given a three-page invoice whose totals are on its last page
    text = SAMPLES["13_us_lab_three_pages_usd.txt"].text
    result = extract(text)
    # Then the total's span names page 3, with offsets into that page's text
    total = result["evidence"]["/total"]
    assert total["page"] == 3
    assert split_pages(text)[2][total["start"] : total["end"]] == "3,855.02"
    assert {span["page"] for span in result["evidence"].values()} == {1, 2, 3}


@pytest.mark.parametrize("filename", sorted(STATED))
def test_every_sample_extracts_the_numbers_the_document_states(filename: str) -> None:
    number, issued, due, currency, iban, line_count, subtotal, tax, total = STATED[filename]
    result = extract(SAMPLES[filename].text)
    assert (result["invoice_number"], result["issue_date"], result["due_date"]) == (number, issued, due)
    assert (result["currency"], result["supplier"]["iban"]) == (currency, iban)
    assert (result["subtotal"], result["tax_total"], result["total"]) == (subtotal, tax, total)
    assert len(result["lines"]) == line_count


def test_bad_arithmetic_is_extracted_as_stated_not_corrected() -> None:
    result = extract(SAMPLES["06_review_bad_arithmetic_try.txt"].text)
    # 1.014,00 + 202,80 is 1.216,80, but the document says 1.316,80 and so does the answer
    assert (result["subtotal"], result["tax_total"], result["total"]) == ("1014.00", "202.80", "1316.80")
    assert _read(SAMPLES["06_review_bad_arithmetic_try.txt"].text, result, "/total") == "1.316,80"


def test_a_line_reads_description_quantity_price_and_amount_with_their_spans() -> None:
    text = SAMPLES["02_de_buerotechnik_eur.txt"].text
    result = extract(text)
    assert result["lines"][0] == {
        "description": "Bürostuhl ErgoPro",
        "quantity": "2",
        "unit_price": "289.00",
        "amount": "578.00",
        "tax_rate": "19",
    }
    assert _read(text, result, "/lines/0/description") == "Bürostuhl ErgoPro"
    assert _read(text, result, "/lines/0/unit_price") == "289,00"
    assert _read(text, result, "/lines/0/tax_rate") == "19 %"
    assert _read(text, result, "/supplier/iban") == "DE89 3704 0044 0532 0130 00"


def test_an_injected_paragraph_is_never_the_source_of_the_iban() -> None:
    # Given a document whose note to "the AI" asks for another IBAN
    text = SAMPLES["08_review_injected_instruction_try.txt"].text
    # Then the honest answer keeps the payment line's IBAN
    assert extract(text)["supplier"]["iban"] == "TR710006200001000000123456"
    # And a model obeying the note reports the injected one, with the span where the note states it
    obeyed = obey_injection(extract(text), text)
    assert obeyed["supplier"]["iban"] == "TR330006100519786457841326"
    span = obeyed["evidence"]["/supplier/iban"]
    assert resolve_span(text, span) == "TR33 0006 1005 1978 6457 8413 26"
    [note] = instruction_passages(split_pages(text))
    assert note.page == span["page"] and note.start <= span["start"] < span["end"] <= note.end


def test_two_different_ibans_outside_any_injection_give_no_iban() -> None:
    text = "Acme Ltd\nIBAN GB29 NWBK 6016 1331 9268 19\n\nor IBAN DE89 3704 0044 0532 0130 00\n"
    result = extract(text)
    assert result["supplier"]["iban"] is None
    assert "/supplier/iban" not in result["evidence"]


def test_obeying_an_injection_changes_nothing_when_the_document_has_none() -> None:
    text = SAMPLES["01_tr_kirtasiye_try.txt"].text
    assert obey_injection(extract(text), text) == extract(text)


def test_a_hallucinated_iban_is_valid_schema_valid_and_nowhere_in_the_text() -> None:
    text = SAMPLES["14_ie_print_hallucination_bait_eur.txt"].text
    result = hallucinate_iban(extract(text), text)
    invented = result["supplier"]["iban"]
    assert sorted(VALIDATOR.iter_errors(result), key=str) == []
    assert stdnum_iban.is_valid(invented)
    assert invented.startswith("IE")
    assert invented not in text.replace(" ", "")
    # And its span is made up: it names a line that does not state the invented IBAN
    pointed = resolve_span(text, result["evidence"]["/supplier/iban"])
    assert pointed is not None and invented not in pointed.replace(" ", "")


def test_broken_json_is_not_json() -> None:
    content = json.dumps(extract(SAMPLES["01_tr_kirtasiye_try.txt"].text))
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken_json(content))


def test_a_currency_stated_only_by_its_symbol_is_read() -> None:
    text = "Bäckerei Sonnenschein\nUSt-IdNr.: DE123456789\nRechnungsnummer: 7\nDatum: 01.12.2026\n\n"
    text += "Brot       3     2,50 €     7,50 €\n\n"
    text += "Nettobetrag:   7,50 €\nMwSt. 7 %:   0,53 €\nGesamtbetrag:   8,03 €\n"
    result = extract(text)
    assert (result["currency"], _read(text, result, "/currency")) == ("EUR", "€")
    assert (result["subtotal"], result["tax_total"], result["total"]) == ("7.50", "0.53", "8.03")


def test_text_that_is_no_invoice_gives_an_answer_that_is_off_schema_not_an_error() -> None:
    result = extract("hello, how are you?")
    assert result["lines"] == [] and result["total"] is None
    assert list(VALIDATOR.iter_errors(result))


@pytest.mark.parametrize(
    ("token", "style", "value"),
    [
        ("1.234,56", "comma", "1234.56"),
        ("1,234.56", "dot", "1234.56"),
        ("48,000", "dot", "48000"),
        ("1\u202f249,00", "comma", "1249.00"),
        ("450,00", "comma", "450.00"),
        ("1.250", "comma", "1250"),
        ("12,34,5", "dot", None),
    ],
)
def test_numbers_read_in_both_grouping_styles(token: str, style: Any, value: str | None) -> None:
    parsed = parse_number(token, style)
    assert (None if parsed is None else format(parsed, "f")) == value


def test_the_number_style_is_decided_by_the_document_not_by_one_token() -> None:
    assert detect_style("Tarih: 27.11.2026\nToner   4   1.250,00   5.000,00\n") == "comma"
    assert detect_style("Date: 2026-11-20\nTape   5   1,250.00   6,250.00\n") == "dot"
    assert detect_style("Tea set   10   4,800   48,000\n") == "dot"


@pytest.mark.parametrize(
    ("text", "iso"),
    [
        ("27.11.2026", "2026-11-27"),
        ("2026-11-20", "2026-11-20"),
        ("November 27, 2026", "2026-11-27"),
        ("18 Nov 2026", "2026-11-18"),
        ("26/11/2026", "2026-11-26"),
        ("2026年11月25日", "2026-11-25"),
        ("3 décembre 2026", "2026-12-03"),
    ],
)
def test_dates_read_in_every_layout(text: str, iso: str) -> None:
    found = find_date(f"Date: {text} ")
    assert found is not None
    assert (found.value.isoformat(), found.quote, found.start) == (iso, text, len("Date: "))
