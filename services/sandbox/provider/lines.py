"""The lines of an invoice: description, quantity, unit price and amount, wherever a layout puts them.

A row is read from the numbers on its line. The amount is the last one; quantity and unit price
are the two before it, nearest first, whose product is the amount to the rounding it shows. That
reads tables with the description first or the quantity first (``Qty  Description  Price  Amount``),
a position or an item code before them, a tax rate column in between, and free-form lines
(``2 x 1,250.00 = 2,500.00``, ``3 Adet x 1.200,00 TL``, ``4 * 8,90 €``, or with the multiplication
sign). A row whose figures do not multiply out is still read as stated when its last three columns
are numbers: a wrong amount stays wrong.

The description is the longest piece of text before the quantity (after the quantity when the
quantity comes first), without bullets, dot leaders, currency marks and the ``x``, ``@`` and ``=``
of a free-form line. Columns in a text layout are separated by two or more spaces, a tab or a pipe;
one space stays inside a cell ("Zeytinyağı 5 L").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from services.sandbox.provider.numbers import CENTS, FoundNumber, Style, number_cell, numbers_in

CELL = re.compile(r"[^ \t|]+(?: [^ \t|]+)*")
Cell = tuple[int, int]  # start and end of a piece of a line

# Words and marks that stand around the figures of a row but belong to no description.
_DECORATION = re.compile(
    r"^(?:[x\u00d7*@=à:;|/\-\u2013\u2014·•]|\.{2,}|…+|[€$£¥₺]|EUR|USD|GBP|JPY|TRY|CHF|TL|each|per|je|pro)$",
    re.IGNORECASE,
)
_TRIM = ".:;,=|-\u2013\u2014·•…*@ \t"


@dataclass(frozen=True)
class Row:
    """One table row: its values, and where on its line each was read (the row's evidence)."""

    description: str
    quantity: Decimal
    unit_price: Decimal
    amount: Decimal
    description_at: Cell
    quantity_at: Cell
    unit_price_at: Cell
    amount_at: Cell


def parse_row(line: str, style: Style, *, cents: bool = False) -> Row | None:
    """One row, or None when the line is not one. With ``cents``, the document writes money with a
    fraction and an amount without one is not money."""
    return _multiplying_row(line, style, cents) or _columns_row(line, style, cents)


def _multiplying_row(line: str, style: Style, cents: bool) -> Row | None:
    numbers = [n for n in numbers_in(line, style) if n.value >= 0]
    if len(numbers) < 3 or (cents and not CENTS.search(numbers[-1].quote)):
        return None
    amount = numbers[-1]
    step = Decimal(5).scaleb(_exponent(amount.value) - 1)  # half a unit of the amount's last digit
    for j in range(len(numbers) - 2, 0, -1):
        for i in range(j - 1, -1, -1):
            quantity, price = numbers[i], numbers[j]
            if quantity.value > 0 and abs(quantity.value * price.value - amount.value) <= step:
                return _row(line, quantity, price, amount)
    return None


def _exponent(value: Decimal) -> int:
    exponent = value.as_tuple().exponent
    return exponent if isinstance(exponent, int) else 0


def _row(line: str, quantity: FoundNumber, price: FoundNumber, amount: FoundNumber) -> Row | None:
    first, second = sorted((quantity, price), key=lambda n: n.start)
    before = _longest_text(line, 0, first.start)
    description = before or _longest_text(line, first.start + len(first.quote), second.start)
    if description is None:
        return None
    start, end = description
    return Row(
        description=line[start:end],
        quantity=quantity.value,
        unit_price=price.value,
        amount=amount.value,
        description_at=description,
        quantity_at=_at(quantity),
        unit_price_at=_at(price),
        amount_at=_at(amount),
    )


def _at(number: FoundNumber) -> Cell:
    return (number.start, number.start + len(number.quote))


def _longest_text(line: str, start: int, end: int) -> Cell | None:
    """The cell between ``start`` and ``end`` with the most letters, trimmed of decoration."""
    best: Cell | None = None
    best_letters = 0
    for match in CELL.finditer(line, start, end):
        cell = _trimmed(line, match.start(), match.end())
        if cell is None:
            continue
        letters = sum(char.isalpha() for char in line[cell[0] : cell[1]])
        if letters > best_letters:
            best, best_letters = cell, letters
    return best


def _trimmed(line: str, start: int, end: int) -> Cell | None:
    """A cell without the decorating words at either end; None when nothing with a letter is left."""
    words = [(m.start(), m.end()) for m in re.finditer(r"\S+", line[start:end])]
    while words and _DECORATION.match(line[start + words[0][0] : start + words[0][1]]):
        words.pop(0)
    while words and _DECORATION.match(line[start + words[-1][0] : start + words[-1][1]]):
        words.pop()
    if not words:
        return None
    first, last = start + words[0][0], start + words[-1][1]
    while first < last and line[first] in _TRIM:
        first += 1
    while last > first and line[last - 1] in _TRIM:
        last -= 1
    piece = line[first:last]
    if not re.search(r"[^\W\d_]", piece) or piece.isdigit():
        return None
    return first, last


def _columns_row(line: str, style: Style, cents: bool) -> Row | None:
    """A row whose last three columns are numbers, read as stated even when they do not multiply."""
    cells = [(m.start(), m.end(), m.group()) for m in CELL.finditer(line)]
    if len(cells) < 4:
        return None
    numbers = [number_cell(text, style) for _, _, text in cells[-3:]]
    quantity, unit_price, amount = numbers
    if quantity is None or unit_price is None or amount is None:
        return None
    if cents and not CENTS.search(cells[-1][2].strip().rstrip("€$£¥₺円 ").rstrip()):
        return None
    described = cells[:-3]
    if len(described) > 1 and described[0][2].isdigit():
        described = described[1:]  # a position number column
    start, end = described[0][0], described[-1][1]
    description = line[start:end]
    if not re.search(r"[^\W\d_]", description):
        return None
    return Row(
        description=description,
        quantity=quantity,
        unit_price=unit_price,
        amount=amount,
        description_at=(start, end),
        quantity_at=_number_at(cells[-3]),
        unit_price_at=_number_at(cells[-2]),
        amount_at=_number_at(cells[-1]),
    )


def _number_at(cell: tuple[int, int, str]) -> Cell:
    """Where the number inside a cell is, without a currency mark beside it: the value's own evidence."""
    start, end, text = cell
    match = re.search(r"-?\d(?:[\d.,'\u2019\u00a0\u202f]*\d)?", text)
    return (start + match.start(), start + match.end()) if match else (start, end)


def parse_rows(
    lines: list[str], style: Style, *, skip: set[int], cents: bool = False
) -> list[tuple[int, Row]]:
    """Every row in reading order, across pages, with its line's index; lines in ``skip``
    (totals) never count."""
    rows: list[tuple[int, Row]] = []
    for index, line in enumerate(lines):
        if index in skip:
            continue
        row = parse_row(line, style, cents=cents)
        if row is not None:
            rows.append((index, row))
    return rows
