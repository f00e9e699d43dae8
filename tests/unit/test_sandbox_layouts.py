"""The simulated provider's reading rules for layouts beyond the samples: free-form and
quantity-first lines, labels without colons, local dates, totals classed by their words.

Given one line or one small document, when the simulator reads it, then it finds what the text
states (and only that), with the span it read it from.
"""

from __future__ import annotations

import pytest

from services.inference.validation import resolve_span
from services.sandbox.provider.dates import find_date, slash_month_first
from services.sandbox.provider.extract import extract
from services.sandbox.provider.lines import parse_row
from services.sandbox.provider.numbers import detect_style
from services.sandbox.provider.totals import classify

ISSUE_EXAMPLE = (
    "Marmara Hidrolik Servis Ltd. Şti.\nVergi No: 7350012284\n\n"
    "FATURA / INVOICE No: INV-2026-0042   Tarih: 2026-11-02\n\n"
    "1  Hydraulic pump service   2 x 1,250.00 = 2,500.00\n\n"
    "Ara Toplam: 2,500.00 TL\nKDV %20: 500.00 TL\nGenel Toplam: 3,000.00 TL\n"
)


def test_the_issues_plain_turkish_invoice_reads_its_number_date_and_line() -> None:
    result = extract(ISSUE_EXAMPLE)
    assert (result["invoice_number"], result["issue_date"], result["currency"]) == (
        "INV-2026-0042",
        "2026-11-02",
        "TRY",
    )
    [line] = result["lines"]
    assert line == {
        "description": "Hydraulic pump service",
        "quantity": "2",
        "unit_price": "1250.00",
        "amount": "2500.00",
        "tax_rate": "20",
    }
    spans = result["evidence"]
    assert resolve_span(ISSUE_EXAMPLE, spans["/invoice_number"]) == "INV-2026-0042"
    assert resolve_span(ISSUE_EXAMPLE, spans["/lines/0/unit_price"]) == "1,250.00"
    assert resolve_span(ISSUE_EXAMPLE, spans["/currency"]) == "TL"


# line -> "description|quantity|unit price|amount" as the line states them
ROWS = {
    "1  Hydraulic pump service   2 x 1,250.00 = 2,500.00": "Hydraulic pump service|2|1250.00|2500.00",
    " 24   Paper cups (sleeve of 50)     £3.85      £92.40": "Paper cups (sleeve of 50)|24|3.85|92.40",
    "- Kalibrasyon      3 Adet x 1.200,00 TL     3.600,00 TL": "Kalibrasyon|3|1200.00|3600.00",
    "Sticker set .......... 4 * 2,50 € = 10,00 €": "Sticker set|4|2.50|10.00",
    "2  SLE-1  Pipette 100-1000 µL   189.00   378.00": "Pipette 100-1000 µL|2|189.00|378.00",
    "| Trail pack 40 L |   4 | 129.00 | 516.00 |": "Trail pack 40 L|4|129.00|516.00",
    "1  Klavye  2 Adet  400,00 TL  %20  800,00 TL": "Klavye|2|400.00|800.00",
    "Montage   16   95.00   1'520.00": "Montage|16|95.00|1520.00",
}


@pytest.mark.parametrize("line", ROWS)
def test_a_row_is_read_from_numbers_that_multiply_out_in_any_common_layout(line: str) -> None:
    row = parse_row(line, detect_style(line), cents=True)
    assert row is not None
    read = "|".join([row.description, *(format(v, "f") for v in (row.quantity, row.unit_price, row.amount))])
    assert read == ROWS[line]
    assert line[slice(*row.description_at)] == row.description


def test_a_row_whose_amount_is_wrong_is_read_as_stated() -> None:
    row = parse_row("Notebook A5        3      10.00      35.00", "dot", cents=True)
    assert row is not None and (row.quantity, row.unit_price, row.amount) == (3, 10, 35)


@pytest.mark.parametrize(
    "line",
    [
        "Dudullu OSB 2. Cad. No: 4 Bina 8",  # 2 x 4 = 8, but no money where money has cents
        "Invoice Date: 11/02/2026",
        "Page 1 of 2",
        "Sort code 20-03-18  Account 73456789",
    ],
)
def test_a_line_without_money_is_no_row(line: str) -> None:
    assert parse_row(line, "dot", cents=True) is None


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("Toplam", "bare"),
        ("Ara Toplam:", "net"),
        ("Genel Toplam", "gross"),
        ("Mal Hizmet Toplam Tutarı:", "net"),
        ("Hesaplanan KDV (%20):", "tax"),
        ("Vergiler Dahil Toplam Tutar:", "gross"),
        ("Summe netto", "net"),
        ("zzgl. 19 % USt", "tax"),
        ("Gesamtbetrag", "gross"),
        ("Total exkl. MWST", "net"),
        ("Net à payer", "gross"),
        ("Total HT", "net"),
        ("Base imponible", "net"),
        ("Importe total", "bare"),
        ("Totaal excl. btw", "net"),
        ("Totaal incl. btw", "gross"),
        ("Totale imponibile", "net"),
        ("Balance Due", "gross"),
        ("Sales Tax (6%)", "tax"),
        ("Terms: Net", None),
        ("Bill To:", None),
    ],
)
def test_a_totals_label_is_classed_by_its_words(label: str, kind: str | None) -> None:
    assert classify(label) == kind


def test_a_bare_total_before_the_tax_line_is_the_subtotal_and_after_it_the_total() -> None:
    text = "Firma\nVKN: 1234567890\nFatura No: A-1\nTarih: 01.10.2026\n\nÇay   2   10,00   20,00\n\n"
    text += "TOPLAM :   20,00 TL\nKDV (%10) :   2,00 TL\nTOPLAM :   22,00 TL\n"
    result = extract(text)
    assert (result["subtotal"], result["tax_total"], result["total"]) == ("20.00", "2.00", "22.00")


def test_a_total_without_tax_line_is_the_net_sum_and_the_zero_tax_has_no_evidence() -> None:
    text = "Jo Design\nEIN: 93-1122334\nInvoice: 7\nDate: 2026-10-05\n\nLogo - 1 x $800.00 = $800.00\n\n"
    text += "Total: $800.00\n"
    result = extract(text)
    assert (result["subtotal"], result["tax_total"], result["total"]) == ("800.00", "0.00", "800.00")
    assert resolve_span(text, result["evidence"]["/subtotal"]) == "800.00"
    assert "/tax_total" not in result["evidence"]


@pytest.mark.parametrize(
    ("text", "month_first", "iso"),
    [
        ("2 Kasım 2026", False, "2026-11-02"),
        ("4 KASIM 2026", False, "2026-11-04"),
        ("5 de octubre de 2026", False, "2026-10-05"),
        ("5th October 2026", False, "2026-10-05"),
        ("2. Nov. 2026", False, "2026-11-02"),
        ("5 ottobre 2026", False, "2026-10-05"),
        ("05-10-2026", False, "2026-10-05"),
        ("10/05/2026", True, "2026-10-05"),
        ("10/05/2026", False, "2026-05-10"),
        ("Oct 5, 2026", False, "2026-10-05"),
    ],
)
def test_local_dates_are_read(text: str, month_first: bool, iso: str) -> None:
    found = find_date(f"x {text} y", month_first=month_first)
    assert found is not None and (found.value.isoformat(), found.quote) == (iso, text)


def test_slash_dates_are_month_first_in_american_documents_unless_a_date_says_otherwise() -> None:
    assert slash_month_first("Date: 10/05/2026", american=True)
    assert not slash_month_first("Date: 10/05/2026", american=False)
    assert not slash_month_first("Date: 10/05/2026  Due: 24/05/2026", american=True)
    assert slash_month_first("Date: 10/05/2026  Due: 10/25/2026", american=False)


@pytest.mark.parametrize(
    ("header", "number", "issued"),
    [
        ("Invoice Number   HCS-1\nInvoice Date     2 Nov 2026", "HCS-1", "2026-11-02"),
        ("Rechnung Nr. 4410\nDatum 05.10.2026", "4410", "2026-10-05"),
        ("Facture n° 77 du 05/10/2026", "77", "2026-10-05"),
        ("Fattura n. 88 del 05/10/2026", "88", "2026-10-05"),
        ("Factuurnr.: F-0091\nDatum: 05-10-2026", "F-0091", "2026-10-05"),
        ("Paris, le 5 octobre 2026\n\nFACTURE N° 2026-31", "2026-31", "2026-10-05"),
        ("Vencimiento: 05/11/2026\nFactura Nº 2026-15\nFecha de emisión: 5 de octubre de 2026", "2026-15",
         "2026-10-05"),
    ],
)  # fmt: skip
def test_invoice_numbers_and_issue_dates_are_read_with_or_without_colons(
    header: str, number: str, issued: str
) -> None:
    result = extract(f"Supplier Ltd\n{header}\n")
    assert (result["invoice_number"], result["issue_date"]) == (number, issued)


def test_a_title_line_is_no_invoice_number() -> None:
    assert extract("Supplier Ltd\nINVOICE   Page 1 of 2\n")["invoice_number"] is None


@pytest.mark.parametrize(
    ("line", "tax_id"),
    [
        ("VAT Reg No. GB 123 4567 89", "GB 123 4567 89"),
        ("EIN 36-4412098", "36-4412098"),
        ("Seyhan V.D. VKN: 2210334455", "2210334455"),
        ("UID: CHE-109.322.551 MWST", "CHE-109.322.551"),
        ("P. IVA: 01122334455 - C.F. 01122334455", "01122334455"),
        ("KvK 30123456   BTW-nummer NL812345678B01", "NL812345678B01"),
    ],
)
def test_tax_ids_are_read_with_spaces_inside_and_without_colons(line: str, tax_id: str) -> None:
    assert extract(f"Supplier Ltd\n{line}\n")["supplier"]["tax_id"] == tax_id


@pytest.mark.parametrize(
    ("text", "currency", "quote"),
    [("Toplam: 5,00 TL", "TRY", "TL"), ("Importi in euro", "EUR", "euro"), ("Total: CHF 5.00", "CHF", "CHF")],
)
def test_a_currency_written_as_a_word_is_read(text: str, currency: str, quote: str) -> None:
    result = extract(f"Supplier\n{text}\n")
    assert result["currency"] == currency
    assert resolve_span(f"Supplier\n{text}\n", result["evidence"]["/currency"]) == quote
