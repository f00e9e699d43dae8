"""The line table of a text invoice: rows whose last three columns are quantity, unit price, amount.

Columns in a text layout are separated by two or more spaces (or a tab); one space stays inside a
cell ("Zeytinyağı 5 L"). A leading position number ("1    Bürostuhl") is not part of the
description. Values are what the row states: a wrong amount stays wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from services.sandbox.provider.numbers import Style, number_cell

CELL = re.compile(r"[^ \t]+(?: [^ \t]+)*")


@dataclass(frozen=True)
class Row:
    description: str
    quantity: Decimal
    unit_price: Decimal
    amount: Decimal
    quantity_quote: str
    unit_price_quote: str
    amount_quote: str


def parse_row(line: str, style: Style) -> Row | None:
    """One table row, or None when the line is not one."""
    cells = [(m.start(), m.end(), m.group()) for m in CELL.finditer(line)]
    if len(cells) < 4:
        return None
    numbers = [number_cell(text, style) for _, _, text in cells[-3:]]
    quantity, unit_price, amount = numbers
    if quantity is None or unit_price is None or amount is None:
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
        quantity_quote=_number_text(cells[-3][2]),
        unit_price_quote=_number_text(cells[-2][2]),
        amount_quote=_number_text(cells[-1][2]),
    )


def _number_text(cell: str) -> str:
    """The number inside a cell, without a currency mark beside it: the value's own evidence."""
    match = re.search(r"-?\d(?:[\d.,\u00a0\u202f]*\d)?", cell)
    return match.group() if match else cell


def parse_rows(lines: list[str], style: Style, *, skip: set[int]) -> list[Row]:
    """Every table row in reading order, across pages; lines in ``skip`` (totals) never count."""
    rows: list[Row] = []
    for index, line in enumerate(lines):
        if index in skip:
            continue
        row = parse_row(line, style)
        if row is not None:
            rows.append(row)
    return rows
