"""Where in the document the simulator read a value, answered the way invoice.v1 asks any model to.

The simulator finds every value at an offset into the whole document text; the answer names it as
``{"page", "start", "end"}``: pages are the parts of the text between form feeds (U+000C), numbered
from 1, and start and end count code points from the start of that page, end exclusive.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

Span = dict[str, int]
_PAGE_BREAK = re.compile("\f")
# The paragraph break the simulator reads by: a line holding nothing but spaces, tabs or form feeds.
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\f]*\n")


@dataclass(frozen=True)
class Located:
    """A piece of the document's text and where it starts (an offset into the whole text)."""

    text: str
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.text)


class Document:
    """A document's text with its lines, where each line starts, and where each page starts."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.lines = text.splitlines()
        self.line_starts: list[int] = []
        offset = 0
        for piece in text.splitlines(keepends=True):
            self.line_starts.append(offset)
            offset += len(piece)
        self._page_breaks = [match.start() for match in _PAGE_BREAK.finditer(text)]

    def in_line(self, line: int, start: int, end: int) -> Located:
        """Characters ``start:end`` of line ``line``, located in the document."""
        return Located(self.lines[line][start:end], self.line_starts[line] + start)

    def line_of(self, offset: int) -> int:
        """The index of the line holding the character at ``offset``."""
        return bisect_right(self.line_starts, offset) - 1

    def span(self, found: Located) -> Span:
        """The answer's span for a located piece (which never holds a form feed)."""
        breaks_before = bisect_right(self._page_breaks, found.start)
        page_start = self._page_breaks[breaks_before - 1] + 1 if breaks_before else 0
        return {"page": breaks_before + 1, "start": found.start - page_start, "end": found.end - page_start}


def located_paragraphs(text: str) -> list[Located]:
    """The text's paragraphs (split at blank lines), each with the offset it starts at."""
    found: list[Located] = []
    at = 0
    for match in _PARAGRAPH_BREAK.finditer(text):
        found.append(Located(text[at : match.start()], at))
        at = match.end()
    found.append(Located(text[at:], at))
    return found
