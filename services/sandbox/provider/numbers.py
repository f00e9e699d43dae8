"""Numbers as invoices write them, read into decimal strings (dates are in ``dates``).

A document writes its money either as 1.234,56 (Turkish, German, French) or 1,234.56 (English,
Japanese, Swiss, which may also group with apostrophes: 1'234.56); the style is decided once per
document by which separator is followed by one or two final digits most often, because a single
token such as 1.250 is ambiguous on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Literal, NamedTuple

Style = Literal["comma", "dot"]  # which character is the decimal separator

# Digits with ".", "," or the non-breaking / narrow spaces French uses to group thousands, or the
# apostrophes Swiss layouts use. Never a plain space: in text layouts two plain spaces separate
# columns.
NUMBER = re.compile(r"(?<![\w.,\u00a0\u202f'\u2019])-?\d(?:[\d.,\u00a0\u202f'\u2019]*\d)?(?![\w])")
GROUP_SPACES = str.maketrans("", "", "\u00a0\u202f\u2009'\u2019")
CENTS = re.compile(r"[.,]\d{2}$")
RATE = re.compile(r"%\s?(\d+(?:[.,]\d+)?)|(\d+(?:[.,]\d+)?)\s?%")

# Symbols and codes that may stand around a number in a table cell.
CURRENCY_MARKS = re.compile(
    r"^(?:[€$£¥₺]|EUR|USD|GBP|JPY|TRY|CHF|TL|円)\s?|\s?(?:[€$£¥₺]|EUR|USD|GBP|JPY|TRY|CHF|TL|円)$"
)


def has_cents(text: str) -> bool:
    """Whether the document writes money with a fraction (1.250,00) rather than without (48,000):
    where it does, an amount without one is a count, a year or a reference, not money."""
    return any(CENTS.search(m.group().translate(GROUP_SPACES)) for m in NUMBER.finditer(text))


def detect_style(text: str) -> Style:
    votes: Counter[str] = Counter()
    for match in NUMBER.finditer(text):
        token = match.group().translate(GROUP_SPACES)
        # dates (27.11.2026) and thousands (48,000) end in more digits and never vote
        final = re.search(r"([.,])\d{1,2}$", token)
        if final:
            votes[final.group(1)] += 1
    return "comma" if votes[","] > votes["."] else "dot"


def parse_number(token: str, style: Style) -> Decimal | None:
    """The value of one number token, or None when it is not a well-formed number in ``style``."""
    raw = token.translate(GROUP_SPACES).strip()
    decimal_sep, group_sep = (",", ".") if style == "comma" else (".", ",")
    if decimal_sep in raw and group_sep in raw and raw.rfind(group_sep) > raw.rfind(decimal_sep):
        decimal_sep, group_sep = group_sep, decimal_sep  # the token itself says otherwise
    integer, _, fraction = raw.partition(decimal_sep)
    if decimal_sep in fraction:
        return None
    groups = integer.lstrip("-").split(group_sep)
    if len(groups) > 1 and (not 1 <= len(groups[0]) <= 3 or any(len(g) != 3 for g in groups[1:])):
        return None
    try:
        return Decimal(integer.replace(group_sep, "") + ("." + fraction if fraction else ""))
    except InvalidOperation:
        return None


def decimal_string(value: Decimal) -> str:
    """A decimal as invoice.v1 writes it: plain notation, the scale the document used."""
    return format(value, "f")


def number_cell(cell: str, style: Style) -> Decimal | None:
    """A table cell holding exactly one number, maybe with a currency symbol or code beside it."""
    bare = CURRENCY_MARKS.sub("", cell.strip()).strip()
    if not NUMBER.fullmatch(bare):
        return None
    return parse_number(bare, style)


class FoundNumber(NamedTuple):
    value: Decimal
    quote: str  # exactly as printed
    start: int  # where in the searched text


def numbers_in(line: str, style: Style) -> list[FoundNumber]:
    """Every well-formed number on a line, in order, leaving out rates (20 %, %20)."""
    found = []
    for match in NUMBER.finditer(line):
        before, after = match.start() - 1, match.end()
        while before >= 0 and line[before] == " ":
            before -= 1
        while after < len(line) and line[after] == " ":
            after += 1
        if (before >= 0 and line[before] == "%") or (after < len(line) and line[after] == "%"):
            continue
        value = parse_number(match.group(), style)
        if value is not None:
            found.append(FoundNumber(value, match.group(), match.start()))
    return found


def last_number(line: str, style: Style, *, skip: tuple[int, int] | None = None) -> FoundNumber | None:
    """The last number on a line (a totals line ends with its amount), its exact text and place."""
    for match in reversed(list(NUMBER.finditer(line))):
        if skip and skip[0] <= match.start() < skip[1]:
            continue
        value = parse_number(match.group(), style)
        if value is not None:
            return FoundNumber(value, match.group(), match.start())
    return None


@dataclass(frozen=True)
class Rate:
    value: str
    quote: str
    span: tuple[int, int]


def find_rate(line: str) -> Rate | None:
    match = RATE.search(line)
    if not match:
        return None
    digits = (match.group(1) or match.group(2)).replace(",", ".")
    return Rate(digits, match.group(), match.span())
