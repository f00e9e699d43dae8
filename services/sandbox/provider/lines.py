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
Cell = tuple[int, int]  # start and end of a piece of a line


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
        description_at=(start, end),
        quantity_at=_number_at(cells[-3]),
        unit_price_at=_number_at(cells[-2]),
        amount_at=_number_at(cells[-1]),
    )


def _number_at(cell: tuple[int, int, str]) -> Cell:
    """Where the number inside a cell is, without a currency mark beside it: the value's own evidence."""
    start, end, text = cell
    match = re.search(r"-?\d(?:[\d.,\u00a0\u202f]*\d)?", text)
    return (start + match.start(), start + match.end()) if match else (start, end)


def parse_rows(lines: list[str], style: Style, *, skip: set[int]) -> list[tuple[int, Row]]:
    """Every table row in reading order, across pages, with its line's index; lines in ``skip``
    (totals) never count."""
    rows: list[tuple[int, Row]] = []
    for index, line in enumerate(lines):
        if index in skip:
            continue
        row = parse_row(line, style)
        if row is not None:
            rows.append((index, row))
    return rows
