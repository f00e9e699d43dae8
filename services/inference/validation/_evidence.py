"""The evidence rules: every extracted value must be re-found where the model says it read it.

The model answers a ``{page, start, end}`` span per field (see ``_spans``), and the span is not
trusted either (seed 000 §4): it must name characters that exist in the stored document, be about
one value wide, and its text must state the value in one of the forms a document writes it in (a
number parsed from it equals the field, names and numbers case-, accent- and whitespace-blind).
Each non-null scalar field that fails gets one ``evidence_missing`` reason naming the field and
the problem. A span that reaches into a passage addressed to the model (see ``_instructions``)
gets ``evidence_in_instruction``: the value may have been dictated to the model, not stated by the
invoice. Both reasons carry the span, so a reviewer can be shown the very characters.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator, Mapping
from datetime import date
from decimal import Decimal, InvalidOperation
from typing import Any

from ._instructions import instruction_passages
from ._model import Reason
from ._parties import compact_iban, normalize_tax_id
from ._spans import resolve_span, span_problem, spans_overlap, split_pages

_NUMBER = re.compile(r"\d+(?:[.,'\u2019\u00a0\u202f]\d+)*")
# French and Swiss layouts group thousands with a plain space ("1 234,56"); tried as a second reading.
_SPACED_NUMBER = re.compile(r"\d{1,3}(?: \d{3})+(?:[.,]\d+)?")
_DIGITS = re.compile(r"\d+")
_NON_DIGIT = re.compile(r"\D")
# A decimal as invoice.v1 writes it (ASCII digits, a point): a text that is exactly such a value
# has that value among its readings (read as 1,234.56).
_PLAIN_DECIMAL = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")
# One to three digits, then groups of three, every separator the same character as the first.
_THOUSANDS = re.compile(r"\d{1,3}(?:(\D)\d{3}(?:\1\d{3})*)?")
_WORD = re.compile(r"[^\W\d_]+")

MONTHS: tuple[tuple[str, ...], ...] = (
    ("january", "januar", "janvier", "ocak", "enero", "gennaio", "januari"),
    ("february", "februar", "fevrier", "subat", "febrero", "febbraio", "februari"),
    ("march", "marz", "mars", "mart", "marzo", "maart"),
    ("april", "avril", "nisan", "abril", "aprile"),
    ("may", "mai", "mayis", "mayo", "maggio", "mei"),
    ("june", "juni", "juin", "haziran", "junio", "giugno"),
    ("july", "juli", "juillet", "temmuz", "julio", "luglio"),
    ("august", "aout", "agustos", "agosto", "augustus"),
    ("september", "septembre", "eylul", "septiembre", "settembre"),
    ("october", "oktober", "octobre", "ekim", "octubre", "ottobre"),
    ("november", "novembre", "kasim", "noviembre"),
    ("december", "dezember", "decembre", "aralik", "diciembre", "dicembre"),
)

CURRENCY_SIGNS: Mapping[str, tuple[str, ...]] = {
    "TRY": ("₺", "tl", "ytl"),
    "EUR": ("€", "euro", "euros"),
    "USD": ("$", "us$", "dollar", "dollars"),
    "GBP": ("£", "pound", "pounds", "sterling"),
    "JPY": ("¥", "円", "yen"),
    "CHF": ("fr.", "sfr"),
}


def normalize_space(text: str) -> str:
    """NFKC, every whitespace run (line breaks, form feeds, tabs) as one space, trimmed."""
    # str.split() splits where the regex \s matches (both ask str.isspace), so joining the words
    # is the substitution of every whitespace run, trimmed, without the regex machinery.
    return " ".join(unicodedata.normalize("NFKC", text).split())


def skeleton(text: str) -> str:
    """Case-, accent- and whitespace-blind form for comparing names ("KIRTASİYE" ~ "Kırtasiye")."""
    if text.isascii():  # nothing to decompose or strip, and casefold is lower (most spans)
        return " ".join(text.lower().split())
    decomposed = unicodedata.normalize("NFKD", text)
    bare = "".join(c for c in decomposed if not unicodedata.combining(c))
    return " ".join(bare.replace("ı", "i").casefold().split())


def number_readings(text: str) -> list[Decimal]:
    """Every number the text may state, each token read as 1.234,56 and as 1,234.56.

    A list, not a set: a span holds a handful of readings, and hashing a Decimal costs more than
    comparing it with each of them."""
    readings: list[Decimal] = []
    for token in _NUMBER.findall(text):
        if token.isdecimal():  # digits alone (most tokens): one reading, no separator to try
            readings.append(Decimal(token))
        else:
            readings.extend(_token_readings(token))
    if " " in text:  # a spaced number needs a plain space
        for token in _SPACED_NUMBER.findall(text):
            readings.extend(_token_readings(token.replace(" ", "")))
    return readings


def _token_readings(token: str) -> Iterator[Decimal]:
    if _grouped(token):
        yield Decimal(_NON_DIGIT.sub("", token))
    for point in ".,":
        whole, sep, fraction = token.rpartition(point)
        if sep and fraction.isdigit() and point not in whole and _grouped(whole):
            yield Decimal(_NON_DIGIT.sub("", whole) + "." + fraction)


def _grouped(token: str) -> bool:
    """Digits, optionally in thousands groups with one kind of separator."""
    if token.isdecimal():  # only digits (\d is str.isdecimal): the common case
        return True
    return _THOUSANDS.fullmatch(token) is not None


def _number_in(value: str, text: str, *, rate: bool = False) -> bool:
    if text == value and _PLAIN_DECIMAL.fullmatch(value):  # the common case: no reading needed
        return True
    try:
        wanted = abs(Decimal(value))
    except InvalidOperation:
        return False
    readings = number_readings(text)
    # A rate may be written as a fraction ("0.20") for a percent the document states ("%20").
    return wanted in readings or (rate and wanted * 100 in readings)


def _date_in(value: str, text: str) -> bool:
    try:
        day = date.fromisoformat(value)
    except ValueError:
        return False
    numbers = [int(d) for d in _DIGITS.findall(text) if len(d) <= 4]
    year_ok = day.year in numbers or any(
        len(d) == 2 and int(d) == day.year % 100 for d in _DIGITS.findall(text)
    )
    words = _WORD.findall(skeleton(text))
    month_ok = day.month in numbers or any(
        len(w) >= 3 and name.startswith(w) for w in words for name in MONTHS[day.month - 1]
    )
    return year_ok and month_ok and day.day in numbers


def _currency_in(value: str, text: str) -> bool:
    folded = skeleton(text)
    words = set(_WORD.findall(folded))
    if value.casefold() in words:
        return True
    # ASCII words must stand alone ("tl", not the end of "total"); symbols and CJK may touch digits.
    signs = CURRENCY_SIGNS.get(value, ())
    return any((sign in words) if sign.isascii() and sign.isalpha() else (sign in folded) for sign in signs)


# These three hold whenever the span's text is the value itself (a string contains itself), which
# is how most names and tax ids are answered: the folding is skipped then.
def _text_in(value: str, text: str) -> bool:
    return value == text or skeleton(value) in skeleton(text)


def _tax_id_in(value: str, text: str) -> bool:
    return value == text or normalize_tax_id(value) in normalize_tax_id(text)


def _iban_in(value: str, text: str) -> bool:
    return value == text or compact_iban(value) in compact_iban(text)


Matcher = Callable[[str, str], bool]
_LINE_FIELDS: tuple[tuple[str, Matcher], ...] = (
    ("description", _text_in),
    ("quantity", _number_in),
    ("unit_price", _number_in),
    ("amount", _number_in),
    ("tax_rate", lambda value, text: _number_in(value, text, rate=True)),
)


def scalar_fields(invoice: Mapping[str, Any]) -> Iterator[tuple[str, Any, Matcher]]:
    """(JSON Pointer, value, how to find the value in a span's text) for every scalar field."""
    supplier = invoice["supplier"]
    yield "/supplier/name", supplier["name"], _text_in
    yield "/supplier/tax_id", supplier["tax_id"], _tax_id_in
    yield "/supplier/iban", supplier["iban"], _iban_in
    yield "/invoice_number", invoice["invoice_number"], _text_in
    yield "/issue_date", invoice["issue_date"], _date_in
    yield "/due_date", invoice["due_date"], _date_in
    yield "/currency", invoice["currency"], _currency_in
    for index, line in enumerate(invoice["lines"]):
        for name, matcher in _LINE_FIELDS:
            yield f"/lines/{index}/{name}", line[name], matcher
    for name in ("subtotal", "tax_total", "total"):
        yield f"/{name}", invoice[name], _number_in


# A span is evidence for one value: the value and the words beside it on its line (a label, a
# currency), never a paragraph or a page, which would "contain" any value asked about.
SPAN_SLACK_CHARS = 64


def evidence_reasons(invoice: Mapping[str, Any], source_text: str) -> list[Reason]:
    """``evidence_missing`` and ``evidence_in_instruction``, field by field in document order."""
    evidence: Mapping[str, Mapping[str, Any]] = invoice["evidence"]
    pages = split_pages(source_text)
    passages = instruction_passages(pages)
    reasons: list[Reason] = []
    for pointer, value, matcher in scalar_fields(invoice):
        if value is None:
            continue
        span = evidence.get(pointer)
        if span is None:
            missing = {"problem": "no_span", "value": value, "span": None, "text": None}
            reasons.append(Reason("evidence_missing", pointer, f"{pointer} has no evidence span", missing))
            continue
        text = resolve_span(pages, span)
        unsupported = _unsupported(pointer, value, matcher, pages, span, text)
        if unsupported is not None:
            reasons.append(unsupported)
        if text is None or not passages:  # most documents address nobody but their reader
            continue
        where = (span["page"], span["start"], span["end"])
        passage = next((p for p in passages if spans_overlap(where, p.range)), None)
        if passage is not None:
            message = (
                f"the evidence of {pointer} ({_place(span)}) lies in a passage addressed to the model "
                f'(page {passage.page}, characters {passage.start}-{passage.end}: "{passage.marker}"): '
                "the value may have been dictated to the model rather than stated by the invoice"
            )
            detail = {"value": value, "span": dict(span), "text": text, "passage": passage.to_json()}
            reasons.append(Reason("evidence_in_instruction", pointer, message, detail))
    return reasons


def _unsupported(
    pointer: str, value: Any, matcher: Matcher, pages: list[str], span: Mapping[str, Any], text: str | None
) -> Reason | None:
    """The ``evidence_missing`` reason when the span (resolved to ``text``) does not support the
    value, else None."""
    if text is None:
        problem = "span_out_of_range"
        message = f"the evidence span of {pointer} names no text: {span_problem(pages, span)}"
    elif _too_wide(text, str(value)):
        problem = "span_too_wide"
        message = (
            f"the evidence span of {pointer} ({_place(span)}) is {len(text)} characters long; "
            "evidence for one value is that value and the words beside it"
        )
    elif not matcher(str(value), text):
        problem = "value_not_in_span"
        message = f'the evidence span of {pointer} ({_place(span)}: "{_clip(text)}") does not state {value}'
    else:
        return None
    detail = {"problem": problem, "value": value, "span": dict(span), "text": text}
    return Reason("evidence_missing", pointer, message, detail)


def _too_wide(text: str, value: str) -> bool:
    # An ASCII text of at most the slack cannot be wider than any value plus the slack (NFKC and
    # the whitespace runs only shorten ASCII), nor can the value itself; the common cases skip
    # normalizing both.
    if (len(text) <= SPAN_SLACK_CHARS and text.isascii()) or text == value:
        return False
    return len(normalize_space(text)) > len(normalize_space(value)) + SPAN_SLACK_CHARS


def _place(span: Mapping[str, Any]) -> str:
    return f"page {span['page']}, characters {span['start']}-{span['end']}"


def _clip(text: str, limit: int = 80) -> str:
    flat = normalize_space(text)
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"
