"""Subtotal, tax and total: the lines under the table, by what their labels say.

A totals line opens with a short label and ends with its amount. The label is classed by the words
in it rather than by a list of whole labels, so "Toplam", "Summe netto", "Totaal excl. BTW" and
"Total inkl. MWST" are all read without being listed one by one:

- *net* words (sub, ara, netto, exkl., HT, imponible, ...) make it the subtotal;
- *gross* words (genel, grand, due, brutto, inkl., TTC, ödenecek, ...) make it the total;
- a tax word (KDV, VAT, MwSt, TVA, IVA, BTW, ...) without either makes it the tax line;
- a bare total word ("Toplam", "Total", "Totaal") is the subtotal when it comes before the tax
  line and the total when it comes after it (or when there is no tax line).

The first line of each kind counts. What the document does not state is filled in only from what
it does state (a total with no tax line is also the net sum, at zero tax), and a value filled in
has no evidence, so validation sends it to a person rather than taking the simulator's word.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Literal

from services.sandbox.provider.numbers import (
    CENTS,
    FoundNumber,
    Rate,
    Style,
    find_rate,
    last_number,
    numbers_in,
)
from services.sandbox.provider.spans import Document, Located

Kind = Literal["net", "gross", "tax", "bare"]

_TOTAL_WORDS = re.compile(
    r"total|toplam|tutar|summe|betrag|totaal|bedrag|totale|importe|montant|amount|balance|netto|brutto"
    r"|imponib|a payer|a pagar|da pagare|小計|合計|請求金額"
)
_TAX_WORDS = re.compile(
    r"\b(?:kdv|vat|mwst|ust|umsatzsteuer|mehrwertsteuer|tax|tva|iva|btw|gst|igic)\b|消費税"
)
_GROSS_WORDS = re.compile(
    r"\b(?:genel|grand|due|payable|brutto\w*|inkl|incl|inclusief|including|ttc|odenecek|dahil|payer|pagar"
    r"|pagare)\b|税込|請求金額"
)
_NET_WORDS = re.compile(
    r"\b(?:sub|subtotal|subtotaal|subtotale|sous|ara|net|netto\w*|exkl|excl|exclusief|excluding|ohne|ht"
    r"|hors|base|imponibile|imponible|zwischen\w*|mal hizmet)\b|小計|税抜|nettobetrag|zwischensumme"
)
_WEAK_GROSS_WORDS = re.compile(r"gesamtbetrag|rechnungsbetrag|endbetrag|rechnungstotal|合計")
_LABEL_MAX_CHARS = 48


@dataclass
class Totals:
    amounts: dict[str, tuple[Decimal, Located | None]] = field(default_factory=dict)
    rate: tuple[str, Located] | None = None  # the tax rate stated on the first tax line
    lines: set[int] = field(default_factory=set)  # every totals line, never a table row


@dataclass(frozen=True)
class _Candidate:
    index: int
    kind: Kind
    amount: FoundNumber
    rate: Rate | None


def classify(label: str) -> Kind | None:
    """What a totals label names, or None when it names no total."""
    words = _fold(label)
    taxed = bool(_TAX_WORDS.search(words))
    if not taxed and not _TOTAL_WORDS.search(words):
        return None
    if _GROSS_WORDS.search(words):
        return "gross"
    if _NET_WORDS.search(words):
        return "net"
    if taxed:
        return "tax"
    return "gross" if _WEAK_GROSS_WORDS.search(words) else "bare"


def _fold(text: str) -> str:
    bare = "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))
    return bare.replace("ı", "i").casefold()


def read_totals(doc: Document, style: Style, *, cents: bool, skip: frozenset[int]) -> Totals:
    """The totals the document states, then what follows from them (see the module docstring).
    Lines in ``skip`` (a supplier's tax id line) are never totals."""
    candidates = [
        c
        for index, line in enumerate(doc.lines)
        if index not in skip
        for c in _candidate(index, line, style, cents)
    ]
    totals = Totals(lines={c.index for c in candidates})
    first_tax = next((c.index for c in candidates if c.kind == "tax"), None)
    chosen: dict[str, _Candidate] = {}
    for candidate in candidates:
        name = {"net": "subtotal", "tax": "tax_total", "gross": "total"}.get(candidate.kind)
        if candidate.kind == "bare":
            name = "subtotal" if first_tax is not None and candidate.index < first_tax else "total"
        if name is not None and name not in chosen:
            chosen[name] = candidate
    for name, candidate in sorted(chosen.items(), key=lambda item: item[1].index):
        where = doc.in_line(
            candidate.index, candidate.amount.start, candidate.amount.start + len(candidate.amount.quote)
        )
        totals.amounts[name] = (candidate.amount.value, where)
        if name == "tax_total" and candidate.rate is not None:
            totals.rate = (candidate.rate.value, doc.in_line(candidate.index, *candidate.rate.span))
    _fill_in(totals)
    return totals


def _candidate(index: int, line: str, style: Style, cents: bool) -> list[_Candidate]:
    rate = find_rate(line)
    amount = last_number(line, style, skip=rate.span if rate else None)
    if amount is None or amount.value < 0 or (cents and not CENTS.search(amount.quote)):
        return []
    label = line[: amount.start]
    if rate is not None and rate.span[1] <= amount.start:  # the label around its rate, without it
        label = label[: rate.span[0]] + " " * (rate.span[1] - rate.span[0]) + label[rate.span[1] :]
    if not re.match(r"^\s*(?:zzgl\.?\s*|plus\s*|\+\s*)?[^\W\d_]", label, re.IGNORECASE):
        return []  # a label opens the line (a tax label may follow "zzgl." and its rate)
    if len(" ".join(label.split())) > _LABEL_MAX_CHARS:
        return []
    kind = classify(label)
    if kind is None:
        return []
    money = [n for n in numbers_in(line, style) if not (rate and rate.span[0] <= n.start < rate.span[1])]
    if len(money) > 2:  # three figures or more make a table row, not a total
        return []
    return [_Candidate(index, kind, amount, rate)]


def _fill_in(totals: Totals) -> None:
    amounts = totals.amounts
    subtotal, tax, total = (amounts.get(name) for name in ("subtotal", "tax_total", "total"))
    if total is not None and subtotal is None and tax is None:
        amounts["subtotal"] = total  # stated as the total; with no tax it is the net sum too
        amounts["tax_total"] = (Decimal(0).scaleb(_exponent(total[0])), None)
    elif total is not None and subtotal is None and tax is not None:
        amounts["subtotal"] = (total[0] - tax[0], None)
    elif total is not None and subtotal is not None and tax is None:
        amounts["tax_total"] = (total[0] - subtotal[0], None)
    elif total is None and subtotal is not None and tax is not None:
        amounts["total"] = (subtotal[0] + tax[0], None)


def _exponent(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return exponent if isinstance(exponent, int) else 0
