"""The simulator's "model": a rule-based reading of an invoice's text into invoice.v1 JSON.

Nothing here knows any particular file. It reads what the document states, by labels and layout,
and answers in ``evidence`` the span of the text each value came from (``spans``). It never
corrects the document: bad arithmetic stays bad, a wrong IBAN stays wrong, so validation
downstream sees what a faithful model would have produced. A field it cannot find is null (or the
list is empty), which may make the answer off-schema, as a real model's answer can be.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from services.sandbox.provider import labels
from services.sandbox.provider.iban import find_ibans
from services.sandbox.provider.lines import parse_rows
from services.sandbox.provider.numbers import (
    Style,
    decimal_string,
    detect_style,
    find_date,
    find_rate,
    last_number,
)
from services.sandbox.provider.spans import Document, Located, located_paragraphs

# A value and the piece of text it was read from.
Reading = tuple[str, Located]


@dataclass
class _Totals:
    amounts: dict[str, tuple[Decimal, Located]] = field(default_factory=dict)  # the first of each
    rate: Reading | None = None  # the tax rate stated on the first tax line
    lines: set[int] = field(default_factory=set)  # every totals line, never a table row


def extract(text: str) -> dict[str, Any]:
    """invoice.v1 for one document text. Pure: the same text always gives the same answer."""
    doc = Document(text)
    lines = doc.lines
    style = detect_style(text)
    evidence: dict[str, dict[str, int]] = {}

    def put(pointer: str, reading: Reading | None) -> str | None:
        if reading is None:
            return None
        value, found = reading
        if found.text:
            evidence[pointer] = doc.span(found)
        return value

    totals = _totals(doc, style)
    result: dict[str, Any] = {
        "schema": "invoice.v1",
        "supplier": {
            "name": put("/supplier/name", supplier_name(doc)),
            "tax_id": put("/supplier/tax_id", _first(labels.TAX_ID, doc)),
            "iban": put("/supplier/iban", supplier_iban(text)),
        },
        "invoice_number": put("/invoice_number", _first(labels.INVOICE_NUMBER, doc)),
        "issue_date": put("/issue_date", _date(labels.ISSUE_DATE, doc)),
        "due_date": put("/due_date", _date(labels.DUE_DATE, doc)),
        "currency": put("/currency", find_currency(doc)),
        "lines": [],
        "subtotal": None,
        "tax_total": None,
        "total": None,
        "evidence": evidence,
    }
    for index, (line, row) in enumerate(parse_rows(lines, style, skip=totals.lines)):
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


def find_currency(doc: Document) -> Reading | None:
    """A labelled code, else the first known code in the text, else a currency symbol."""
    labelled = _first(labels.CURRENCY, doc)
    if labelled and labelled[0] in labels.CURRENCY_CODES:
        return labelled
    code = re.search(rf"(?<![A-Za-z])({'|'.join(labels.CURRENCY_CODES)})(?![A-Za-z])", doc.text)
    if code:
        return code.group(1), Located(code.group(1), code.start(1))
    for symbol, iso in labels.CURRENCY_SYMBOLS:
        at = doc.text.find(symbol)
        if at >= 0:
            return iso, Located(symbol, at)
    return None


def _first(pattern: re.Pattern[str], doc: Document) -> Reading | None:
    for index, line in enumerate(doc.lines):
        match = pattern.search(line)
        if match:
            return match.group("v"), doc.in_line(index, *match.span("v"))
    return None


def _date(pattern: re.Pattern[str], doc: Document) -> Reading | None:
    for index, line in enumerate(doc.lines):
        match = pattern.search(line)
        if match:
            found = find_date(match.group("v"))
            if found:
                start = match.start("v") + found.start
                return found.value.isoformat(), doc.in_line(index, start, start + len(found.quote))
    return None


def _totals(doc: Document, style: Style) -> _Totals:
    """Subtotal, tax and total by the labels that open their lines; the first of each counts."""
    totals = _Totals()
    for index, line in enumerate(doc.lines):
        if labels.TAX_ID.search(line):
            continue
        for name, pattern in (
            ("subtotal", labels.SUBTOTAL),
            ("tax_total", labels.TAX),
            ("total", labels.TOTAL),
        ):
            if not pattern.search(line):
                continue
            rate = find_rate(line) if name == "tax_total" else None
            amount = last_number(line, style, skip=rate.span if rate else None)
            if amount is None:
                continue
            totals.lines.add(index)
            if name not in totals.amounts:
                where = doc.in_line(index, amount.start, amount.start + len(amount.quote))
                totals.amounts[name] = (amount.value, where)
                if rate is not None and totals.rate is None:
                    totals.rate = (rate.value, doc.in_line(index, *rate.span))
            break
    return totals
