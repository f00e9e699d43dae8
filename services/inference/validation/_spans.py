"""Evidence spans: where in the stored document a value was read, as ``{page, start, end}``.

A document's text holds its OCR pages separated by form feeds (U+000C); page 1 is the text before
the first one. ``start`` and ``end`` count Unicode code points from the start of that page's text,
``end`` exclusive, so a span's text is ``pages[page - 1][start:end]``. Pure: validation resolves
spans with it, and a page that shows a span to a person can resolve exactly the same text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

PAGE_BREAK = "\f"


def split_pages(text: str) -> list[str]:
    """The pages of a stored document text, in order (a text without a form feed is one page)."""
    return text.split(PAGE_BREAK)


def span_problem(pages: Sequence[str], span: object) -> str | None:
    """None when ``span`` names characters that exist, else why it does not, in words."""
    # A parsed answer's spans are dicts; the ABC check for any other Mapping costs more than the rest.
    if type(span) is not dict and not isinstance(span, Mapping):
        return "the span is not an object with page, start and end"
    page, start, end = span.get("page"), span.get("start"), span.get("end")
    if not (type(page) is int and type(start) is int and type(end) is int) and not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (page, start, end)
    ):
        return "page, start and end must be whole numbers"
    assert isinstance(page, int) and isinstance(start, int) and isinstance(end, int)
    if not 1 <= page <= len(pages):
        count = len(pages)
        return f"page {page} does not exist (the document has {count} page{'' if count == 1 else 's'})"
    if start < 0 or end <= start:
        return f"start {start} and end {end} do not enclose any character (start < end, end exclusive)"
    length = len(pages[page - 1])
    if end > length:
        return f"characters {start}-{end} run past the end of page {page}, which has {length}"
    return None


def resolve_span(pages_or_text: str | Sequence[str], span: object) -> str | None:
    """The text a ``{page, start, end}`` span names, or None when it names no text.

    ``pages_or_text`` is the stored document text (split at form feeds) or its pages already split.
    """
    pages = split_pages(pages_or_text) if isinstance(pages_or_text, str) else pages_or_text
    # A parsed answer's span is a dict of ints naming existing text: read each field once and
    # slice. Anything else goes the long way, where span_problem decides (the same conditions).
    if type(span) is dict:
        page, start, end = span.get("page"), span.get("start"), span.get("end")
        if type(page) is int and type(start) is int and type(end) is int and 0 < page <= len(pages):
            page_text = pages[page - 1]
            if 0 <= start < end <= len(page_text):
                return page_text[start:end]
    if span_problem(pages, span) is not None:
        return None
    assert isinstance(span, Mapping)
    text: str = pages[span["page"] - 1][span["start"] : span["end"]]
    return text


def spans_overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    """Whether two (page, start, end) ranges share a character."""
    return a[0] == b[0] and a[1] < b[2] and b[1] < a[2]
