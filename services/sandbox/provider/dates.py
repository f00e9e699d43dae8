"""Dates as invoices write them, read into ISO dates.

Numeric dates (``2026-11-02``, ``02.11.2026``, ``02-11-2026``, ``02/11/2026``), Japanese dates,
and dates with month names in the languages the samples use (``2 Nov 2026``, ``2nd November
2026``, ``November 2, 2026``, ``2 Kasım 2026``, ``2 de noviembre de 2026``). A slash date is day
first unless the document is American (``month_first``) or one of its own dates says otherwise.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import date
from typing import NamedTuple

_MONTH_NAMES = (
    ("january", "jan", "januar", "janvier", "ocak", "enero", "ene", "gennaio", "gen", "januari"),
    ("february", "feb", "februar", "février", "şubat", "febrero", "febbraio", "februari"),
    ("march", "mar", "märz", "mars", "mart", "marzo", "maart", "mrt"),
    ("april", "apr", "avril", "nisan", "abril", "abr", "aprile"),
    ("may", "mai", "mayıs", "mayo", "maggio", "mag", "mei"),
    ("june", "jun", "juni", "juin", "haziran", "junio", "giugno", "giu"),
    ("july", "jul", "juli", "juillet", "temmuz", "julio", "luglio", "lug"),
    ("august", "aug", "août", "ağustos", "agosto", "ago", "augustus"),
    ("september", "sep", "sept", "septembre", "eylül", "septiembre", "setiembre", "settembre", "set"),
    ("october", "oct", "oktober", "okt", "octobre", "ekim", "octubre", "ottobre", "ott"),
    ("november", "nov", "novembre", "kasım", "noviembre"),
    ("december", "dec", "dezember", "dez", "décembre", "aralık", "diciembre", "dic", "dicembre"),
)


def _fold(word: str) -> str:
    """Lower case without accents, dotless and dotted i alike: "KASIM", "Kasım" and "kasim" meet."""
    bare = "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c))
    return bare.replace("ı", "i").casefold()


MONTHS = {_fold(name): number for number, names in enumerate(_MONTH_NAMES, start=1) for name in names}

_MONTH = r"([^\W\d_]{3,10})\.?"
_DAY_THEN_MONTH = rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\.?\s+(?:de\s+)?{_MONTH}\s+(?:de\s+)?(\d{{4}})\b"
DATE_FORMATS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b(\d{4})-(\d{2})-(\d{2})\b"), "ymd"),
    (re.compile(r"(\d{4})\s?年\s?(\d{1,2})\s?月\s?(\d{1,2})\s?日"), "ymd"),
    (re.compile(r"\b(\d{4})/(\d{1,2})/(\d{1,2})\b"), "ymd"),
    (re.compile(r"\b(\d{1,2})\.(\d{1,2})\.(\d{4})\b"), "dmy"),
    (re.compile(r"\b(\d{1,2})-(\d{1,2})-(\d{4})\b"), "dmy"),
    (re.compile(r"\b(\d{1,2})/(\d{1,2})/(\d{4})\b"), "slash"),
    (re.compile(rf"\b{_MONTH}\s+(\d{{1,2}}),\s*(\d{{4}})\b"), "Mdy"),
    (re.compile(_DAY_THEN_MONTH, re.IGNORECASE), "dMy"),
)
_SLASH = re.compile(r"\b(\d{1,2})/(\d{1,2})/\d{4}\b")


class FoundDate(NamedTuple):
    value: date
    quote: str  # exactly as printed
    start: int  # where in the searched text


def find_date(text: str, *, month_first: bool = False) -> FoundDate | None:
    """The first date in ``text`` in any layout this module reads, with its exact text and place."""
    found: list[FoundDate] = []
    for pattern, order in DATE_FORMATS:
        for match in pattern.finditer(text):
            parsed = _to_date(match.groups(), order, month_first)
            if parsed is not None:
                found.append(FoundDate(parsed, match.group(), match.start()))
                break
    return min(found, key=lambda item: item.start) if found else None


def slash_month_first(text: str, *, american: bool) -> bool:
    """Whether the document's slash dates put the month first: a date that can only be read one
    way decides (11/27/2026, 27/11/2026); otherwise an American document does."""
    for match in _SLASH.finditer(text):
        first, second = int(match.group(1)), int(match.group(2))
        if first > 12 >= second:
            return False
        if second > 12 >= first:
            return True
    return american


def _to_date(parts: tuple[str, ...], order: str, month_first: bool) -> date | None:
    try:
        if order == "ymd":
            y, m, d = int(parts[0]), int(parts[1]), int(parts[2])
        elif order in ("dmy", "slash"):
            d, m, y = int(parts[0]), int(parts[1]), int(parts[2])
            if order == "slash" and month_first:
                d, m = m, d
            if m > 12 >= d:  # 11/27/2026 can only be month first, 27/11/2026 only day first
                d, m = m, d
        elif order == "Mdy":
            m, d, y = MONTHS.get(_fold(parts[0]), 0), int(parts[1]), int(parts[2])
        else:
            d, m, y = int(parts[0]), MONTHS.get(_fold(parts[1]), 0), int(parts[2])
        return date(y, m, d)
    except ValueError:
        return None
