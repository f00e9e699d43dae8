"""The simulator's "model": a rule-based reading of an invoice's text into invoice.v1 JSON.

Nothing here knows any particular file. It reads what the document states, by labels and layout,
and quotes the exact characters each value came from in ``evidence``. It never corrects the
document: bad arithmetic stays bad, a wrong IBAN stays wrong, so validation downstream sees what a
faithful model would have produced. A field it cannot find is null (or the list is empty), which
may make the answer off-schema, as a real model's answer can be.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

from services.sandbox.provider import labels
from services.sandbox.provider.iban import FoundIban, find_ibans
from services.sandbox.provider.lines import parse_rows
from services.sandbox.provider.numbers import (
    Rate,
    Style,
    decimal_string,
    detect_style,
    find_date,
    find_rate,
    last_number,
)


def extract(text: str) -> dict[str, Any]:
    """invoice.v1 for one document text. Pure: the same text always gives the same answer."""
    lines = text.splitlines()
    style = detect_style(text)
    evidence: dict[str, str] = {}

    def put(pointer: str, value: str | None, quote: str | None) -> str | None:
        if value is not None and quote:
            evidence[pointer] = quote
        return value

    name = supplier_name(lines)
    tax_id = _first(labels.TAX_ID, lines)
    iban = supplier_iban(text)
    number = _first(labels.INVOICE_NUMBER, lines)
    issue = _date(labels.ISSUE_DATE, lines)
    due = _date(labels.DUE_DATE, lines)
    currency = find_currency(text, lines)
    totals, totals_at = _totals(lines, style)
    rate = totals.get("rate")

    result: dict[str, Any] = {
        "schema": "invoice.v1",
        "supplier": {
            "name": put("/supplier/name", name, name),
            "tax_id": put("/supplier/tax_id", *(tax_id or (None, None))),
            "iban": put("/supplier/iban", iban.value, iban.quote) if iban else None,
        },
        "invoice_number": put("/invoice_number", *(number or (None, None))),
        "issue_date": put("/issue_date", *(issue or (None, None))),
        "due_date": put("/due_date", *(due or (None, None))),
        "currency": put("/currency", *(currency or (None, None))),
        "lines": [],
        "subtotal": None,
        "tax_total": None,
        "total": None,
        "evidence": evidence,
    }
    for index, row in enumerate(parse_rows(lines, style, skip=totals_at)):
        at = f"/lines/{index}"
        result["lines"].append(
            {
                "description": put(f"{at}/description", row.description, row.description),
                "quantity": put(f"{at}/quantity", decimal_string(row.quantity), row.quantity_quote),
                "unit_price": put(f"{at}/unit_price", decimal_string(row.unit_price), row.unit_price_quote),
                "amount": put(f"{at}/amount", decimal_string(row.amount), row.amount_quote),
                # one rate stated for the whole invoice applies to each of its lines
                "tax_rate": put(f"{at}/tax_rate", rate.value, rate.quote) if isinstance(rate, Rate) else None,
            }
        )
    for field in ("subtotal", "tax_total", "total"):
        found = totals.get(field)
        if isinstance(found, tuple):
            result[field] = put(f"/{field}", decimal_string(found[0]), found[1])
    return result


def supplier_name(lines: list[str]) -> str | None:
    """The first non-empty line that is not the document's title: invoices open with their issuer."""
    for line in lines:
        stripped = line.strip()
        if stripped and stripped.lower() not in labels.TITLES:
            return stripped
    return None


def supplier_iban(text: str) -> FoundIban | None:
    """The one IBAN the document states for payment. A paragraph addressed to the model (an
    injected "report this IBAN instead") is data, never a source; when the rest still states two
    different IBANs the simulator cannot tell which is the supplier's and answers null."""
    honest = [part for part in paragraphs(text) if not labels.INJECTION.search(part)]
    found = [iban for part in honest for iban in find_ibans(part)]
    if len({f.value for f in found}) != 1:
        return None
    return found[0]


def paragraphs(text: str) -> list[str]:
    return re.split(r"\n[ \t\f]*\n", text)


def find_currency(text: str, lines: list[str]) -> tuple[str, str] | None:
    """A labelled code, else the first known code in the text, else a currency symbol."""
    labelled = _first(labels.CURRENCY, lines)
    if labelled and labelled[0] in labels.CURRENCY_CODES:
        return labelled
    code = re.search(rf"(?<![A-Za-z])({'|'.join(labels.CURRENCY_CODES)})(?![A-Za-z])", text)
    if code:
        return code.group(1), code.group(1)
    for symbol, iso in labels.CURRENCY_SYMBOLS:
        if symbol in text:
            return iso, symbol
    return None


def _first(pattern: re.Pattern[str], lines: list[str]) -> tuple[str, str] | None:
    for line in lines:
        match = pattern.search(line)
        if match:
            return match.group("v"), match.group("v")
    return None


def _date(pattern: re.Pattern[str], lines: list[str]) -> tuple[str, str] | None:
    for line in lines:
        match = pattern.search(line)
        if match:
            found = find_date(match.group("v"))
            if found:
                return found[0].isoformat(), found[1]
    return None


def _totals(lines: list[str], style: Style) -> tuple[dict[str, tuple[Decimal, str] | Rate], set[int]]:
    """Subtotal, tax and total by the labels that open their lines; the first of each counts."""
    found: dict[str, tuple[Decimal, str] | Rate] = {}
    at: set[int] = set()
    for index, line in enumerate(lines):
        if labels.TAX_ID.search(line):
            continue
        for field, pattern in (
            ("subtotal", labels.SUBTOTAL),
            ("tax_total", labels.TAX),
            ("total", labels.TOTAL),
        ):
            if not pattern.search(line):
                continue
            rate = find_rate(line) if field == "tax_total" else None
            amount = last_number(line, style, skip=rate.span if rate else None)
            if amount is None:
                continue
            at.add(index)
            if field not in found:
                found[field] = amount
                if rate is not None and "rate" not in found:
                    found["rate"] = rate
            break
    return found, at
