"""The simulator's "model": a rule-based reading of an invoice's text into invoice.v1 JSON.

Nothing here knows any particular file. It reads what the document states, by labels and layout,
and answers in ``evidence`` the span of the text each value came from (``spans``). It never
corrects the document: bad arithmetic stays bad, a wrong IBAN stays wrong, so validation
downstream sees what a faithful model would have produced. A total the document implies but does
not state (no tax line: zero tax) is filled in without evidence, so validation asks a person. A
field it cannot find is null (or the list is empty), which may make the answer off-schema, as a
real model's answer can be.
"""

from __future__ import annotations

import re
from typing import Any

from services.sandbox.provider import labels
from services.sandbox.provider.dates import find_date, slash_month_first
from services.sandbox.provider.iban import find_ibans
from services.sandbox.provider.lines import parse_rows
from services.sandbox.provider.numbers import decimal_string, detect_style, has_cents
from services.sandbox.provider.spans import Document, Located, located_paragraphs
from services.sandbox.provider.totals import read_totals

# A value and the piece of text it was read from (None for a value the text implies but never states).
Reading = tuple[str, Located | None]


def extract(text: str) -> dict[str, Any]:
    """invoice.v1 for one document text. Pure: the same text always gives the same answer."""
    doc = Document(text)
    style = detect_style(text)
    cents = has_cents(text)
    evidence: dict[str, dict[str, int]] = {}

    def put(pointer: str, reading: Reading | None) -> str | None:
        if reading is None:
            return None
        value, found = reading
        if found is not None and found.text:
            evidence[pointer] = doc.span(found)
        return value

    tax_id_lines = frozenset(i for i, line in enumerate(doc.lines) if labels.TAX_ID.search(line))
    totals = read_totals(doc, style, cents=cents, skip=tax_id_lines)
    currency = find_currency(doc)
    month_first = slash_month_first(text, american=currency is not None and currency[0] == "USD")
    number = _first(labels.INVOICE_NUMBER, doc)
    result: dict[str, Any] = {
        "schema": "invoice.v1",
        "supplier": {
            "name": put("/supplier/name", supplier_name(doc)),
            "tax_id": put("/supplier/tax_id", _first(labels.TAX_ID, doc)),
            "iban": put("/supplier/iban", supplier_iban(text)),
        },
        "invoice_number": put("/invoice_number", number),
        "issue_date": put("/issue_date", issue_date(doc, number, month_first)),
        "due_date": put("/due_date", _date(labels.DUE_DATE, doc, month_first)),
        "currency": put("/currency", currency),
        "lines": [],
        "subtotal": None,
        "tax_total": None,
        "total": None,
        "evidence": evidence,
    }
    for index, (line, row) in enumerate(parse_rows(doc.lines, style, skip=totals.lines, cents=cents)):
        cells = {
            "description": (row.description, row.description_at),
            "quantity": (decimal_string(row.quantity), row.quantity_at),
            "unit_price": (decimal_string(row.unit_price), row.unit_price_at),
            "amount": (decimal_string(row.amount), row.amount_at),
        }
        item = {
            name: put(f"/lines/{index}/{name}", (value, doc.in_line(line, *cell)))
            for name, (value, cell) in cells.items()
        }
        # one rate stated for the whole invoice applies to each of its lines
        item["tax_rate"] = put(f"/lines/{index}/tax_rate", totals.rate)
        result["lines"].append(item)
    for name, (amount, found) in totals.amounts.items():
        result[name] = put(f"/{name}", (decimal_string(amount), found))
    return result


def supplier_name(doc: Document) -> Reading | None:
    """The first non-empty line that is not the document's title: invoices open with their issuer."""
    for index, line in enumerate(doc.lines):
        stripped = line.strip()
        if stripped and stripped.lower() not in labels.TITLES:
            start = len(line) - len(line.lstrip())
            return stripped, doc.in_line(index, start, start + len(stripped))
    return None


def supplier_iban(text: str) -> Reading | None:
    """The one IBAN the document states for payment. A paragraph addressed to the model (an
    injected "report this IBAN instead") is data, never a source; when the rest still states two
    different IBANs the simulator cannot tell which is the supplier's and answers null."""
    honest = [part for part in located_paragraphs(text) if not labels.INJECTION.search(part.text)]
    found = [(iban, part.start) for part in honest for iban in find_ibans(part.text)]
    if len({iban.value for iban, _ in found}) != 1:
        return None
    iban, offset = found[0]
    return iban.value, Located(iban.quote, offset + iban.start)


def paragraphs(text: str) -> list[str]:
    return [part.text for part in located_paragraphs(text)]


def find_currency(doc: Document) -> tuple[str, Located] | None:
    """A labelled code, else the first known code in the text, else a currency symbol, else a
    currency written as a word ("TL", "in euro")."""
    labelled = _first(labels.CURRENCY, doc)
    if labelled and labelled[0] in labels.CURRENCY_CODES and labelled[1] is not None:
        return labelled[0], labelled[1]
    code = re.search(rf"(?<![A-Za-z])({'|'.join(labels.CURRENCY_CODES)})(?![A-Za-z])", doc.text)
    if code:
        return code.group(1), Located(code.group(1), code.start(1))
    for symbol, iso in labels.CURRENCY_SYMBOLS:
        at = doc.text.find(symbol)
        if at >= 0:
            return iso, Located(symbol, at)
    word = labels.CURRENCY_WORDS.search(doc.text)
    if word and word.lastgroup:
        return word.lastgroup, Located(word.group(), word.start())
    return None


def issue_date(doc: Document, number: Reading | None, month_first: bool) -> Reading | None:
    """The labelled issue date; else the date on the invoice number's line ("Facture n° 12 du
    02/11/2026"); else the first date the first page states outside a due date's line ("Zürich,
    2. November 2026")."""
    labelled = _date(labels.ISSUE_DATE, doc, month_first)
    if labelled is not None:
        return labelled
    if number is not None and number[1] is not None:
        index = doc.line_of(number[1].start)
        after = number[1].end - doc.line_starts[index]
        found = find_date(doc.lines[index][after:], month_first=month_first)
        if found is not None:
            return _reading(doc, index, after + found.start, found.quote, found.value.isoformat())
    page_break = doc.text.find("\f")
    for index, line in enumerate(doc.lines):
        if 0 <= page_break < doc.line_starts[index]:
            break
        if labels.DUE_DATE.search(line):
            continue
        found = find_date(line, month_first=month_first)
        if found is not None:
            return _reading(doc, index, found.start, found.quote, found.value.isoformat())
    return None


def _reading(doc: Document, index: int, start: int, quote: str, value: str) -> Reading:
    return value, doc.in_line(index, start, start + len(quote))


def _first(pattern: re.Pattern[str], doc: Document) -> Reading | None:
    for index, line in enumerate(doc.lines):
        match = pattern.search(line)
        if match:
            return match.group("v"), doc.in_line(index, *match.span("v"))
    return None


# What may stand between a date's label and the date: at most one short word ("le", "am", "du").
_BEFORE_DATE = re.compile(r"^[^\w]*(?:\w{1,4}[^\w]+)?$")


def _date(pattern: re.Pattern[str], doc: Document, month_first: bool) -> Reading | None:
    """The first labelled date: the date must open the label's value, so "Date d'échéance" is
    never an issue date and "Zahlungsziel: 14 Tage (16.11.2026)" no due date."""
    for index, line in enumerate(doc.lines):
        for match in pattern.finditer(line):
            value = match.group("v")
            found = find_date(value, month_first=month_first)
            if found and _BEFORE_DATE.match(value[: found.start]):
                start = match.start("v") + found.start
                return _reading(doc, index, start, found.quote, found.value.isoformat())
    return None
