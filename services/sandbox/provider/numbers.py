"""Numbers and dates as invoices write them, read into decimal strings and ISO dates.

A document writes its money either as 1.234,56 (Turkish, German, French) or 1,234.56 (English,
Japanese); the style is decided once per document by which separator is followed by one or two
final digits most often, because a single token such as 1.250 is ambiguous on its own.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Literal, NamedTuple

Style = Literal["comma", "dot"]  # which character is the decimal separator

# Digits with ".", "," or the non-breaking / narrow spaces French uses to group thousands.
# Never a plain space: in text layouts two plain spaces separate columns.
NUMBER = re.compile(r"(?<![\w.,\u00a0\u202f])-?\d(?:[\d.,\u00a0\u202f]*\d)?(?![\w])")
GROUP_SPACES = str.maketrans("", "", "\u00a0\u202f\u2009")
RATE = re.compile(r"%\s?(\d+(?:[.,]\d+)?)|(\d+(?:[.,]\d+)?)\s?%")

# Symbols and codes that may stand around a number in a table cell.
CURRENCY_MARKS = re.compile(
    r"^(?:[€$£¥₺]|EUR|USD|GBP|JPY|TRY|TL|円)\s?|\s?(?:[€$£¥₺]|EUR|USD|GBP|JPY|TRY|TL|円)$"
)


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


MONTHS = {
    name: number
    for number, names in enumerate(
        [
            ("january", "jan", "januar", "janvier", "ocak"),
            ("february", "feb", "februar", "février", "fevrier", "şubat"),
            ("march", "mar", "märz", "mars", "mart"),
            ("april", "apr", "avril", "nisan"),
            ("may", "mai", "mayıs"),
            ("june", "jun", "juni", "juin", "haziran"),
            ("july", "jul", "juli", "juillet", "temmuz"),
            ("august", "aug", "août", "aout", "ağustos"),
            ("september", "sep", "sept", "septembre", "eylül"),
            ("october", "oct", "oktober", "okt", "octobre", "ekim"),
            ("november", "nov", "novembre", "kasım"),
            ("december", "dec", "dezember", "dez", "décembre", "decembre", "aralık"),
        ],
        start=1,
    )
    for name in names
}
_MONTH = r"([^\W\d_]{3,10})\.?"
DATE_FORMATS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b"), "ymd"),
    (re.compile(r"(\d{4})\s?年\s?(\d{1,2})\s?月\s?(\d{1,2})\s?日"), "ymd"),
    (re.compile(r"\b(\d{4})/(\d{1,2})/(\d{1,2})\b"), "ymd"),
    (re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b"), "dmy"),
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"), "dmy"),
    (re.compile(rf"\b{_MONTH}\s+(\d{{1,2}}),\s*(\d{{4}})\b"), "Mdy"),
    (re.compile(rf"\b(\d{{1,2}})\.?\s+{_MONTH}\s+(\d{{4}})\b"), "dMy"),
)


class FoundDate(NamedTuple):
    value: date
    quote: str  # exactly as printed
    start: int  # where in the searched text


def find_date(text: str) -> FoundDate | None:
    """The first date in ``text`` in any layout this module reads, with its exact text and place."""
    found: list[FoundDate] = []
    for pattern, order in DATE_FORMATS:
        for match in pattern.finditer(text):
            parsed = _to_date(match.groups(), order)
            if parsed is not None:
                found.append(FoundDate(parsed, match.group(), match.start()))
                break
    return min(found, key=lambda item: item.start) if found else None


def _to_date(parts: tuple[str, ...], order: str) -> date | None:
    try:
        if order == "ymd":
            y, m, d = int(parts[0]), int(parts[1]), int(parts[2])
        elif order == "dmy":
            d, m, y = int(parts[0]), int(parts[1]), int(parts[2])
            if m > 12 >= d:  # 11/27/2026 can only be month first
                d, m = m, d
        elif order == "Mdy":
            m, d, y = MONTHS.get(parts[0].lower(), 0), int(parts[1]), int(parts[2])
        else:
            d, m, y = int(parts[0]), MONTHS.get(parts[1].lower(), 0), int(parts[2])
        return date(y, m, d)
    except ValueError:
        return None
