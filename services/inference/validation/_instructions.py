"""Passages of a document that address the model instead of its reader (prompt injections).

A passage starts at the line holding a phrase that speaks to an AI ("ignore all previous
instructions", "disregard the above", "note to the AI", "you are an AI", "system prompt", a line
opening with "assistant:", chat-template tokens, and their Turkish and German forms) and runs to the
end of that paragraph (the next blank line, or the page's end): what the injected text goes on to
say belongs to it, the invoice lines above it do not. An invoice states its figures to the buyer,
never as orders to a model, so a value read from inside such a passage is flagged for a person
(``evidence_in_instruction``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

_EARLIER = r"(?:previous|prior|above|earlier|preceding|foregoing|original)"
_ORDERS = r"(?:instructions?|rules|prompts?|directions|directives|commands|messages?|guidelines)"
_AI = r"(?:ai|a\.i\.|llm|(?:large\s+)?language\s+model|chat\s?bot|assistant|model|gpt)"
_WHO = r"(?:the\s+|your\s+|any\s+|all\s+|of\s+)*"

MARKERS = re.compile(
    "|".join(
        (
            # English
            rf"\b(?:ignore|disregard|forget|override)\s+{_WHO}{_EARLIER}\s+(?:system\s+)?{_ORDERS}\b",
            rf"\b(?:ignore|disregard|forget|override)\s+(?:all\s+(?:of\s+)?)?your\s+(?:system\s+)?{_ORDERS}\b",
            rf"\b(?:ignore|disregard|forget)\s+{_WHO}{_ORDERS}\s+(?:above|before\s+this)\b",
            rf"\bdisregard\s+{_WHO}(?:the\s+)?above\b",
            rf"\bnote\s+to\s+(?:the\s+)?{_AI}\b",
            r"\b(?:to|for)\s+(?:the\s+|any\s+)?(?:ai|llm|language\s+model)\s+(?:reading|processing|extracting)\b",
            r"\byou\s+are\s+(?:now\s+)?(?:an?\s+)?(?:ai|a\.i\.|llm|(?:large\s+)?language\s+model|"
            r"artificial\s+intelligence|chat\s?bot|ai\s+assistant)\b",
            r"\bsystem\s+(?:prompt|message)\b",
            r"\bnew\s+instructions\s*:",
            r"(?m:^[ \t]*assistant\s*:)",
            r"<\|im_(?:start|end)\|>|\[/?INST\]|<</?SYS>>",
            # Turkish
            r"\b(?:tüm\s+|bütün\s+)?(?:önceki|yukarıdaki)\s+(?:tüm\s+|bütün\s+)?talimatlar",
            r"\btalimatları\s+(?:yok\s+say|görmezden\s+gel|dikkate\s+alma|unut)",
            r"\byapay\s+zek[aâ]ya\s+(?:not|talimat|mesaj)",
            r"\bsen\s+bir\s+(?:yapay\s+zek[aâ]|dil\s+modeli)",
            r"\bsistem\s+(?:istemi|talimatı|mesajı)",
            # German
            r"\b(?:ignorier\w*|vergiss|vergessen|missachte\w*)\s+(?:sie\s+)?(?:alle\s+|die\s+|sämtliche\s+)*"
            r"(?:vorherigen|bisherigen|obigen|vorangegangenen|früheren|vorigen)\s+"
            r"(?:anweisungen|instruktionen|befehle|regeln|vorgaben)",
            r"\b(?:hinweis|nachricht|notiz|anweisung)\s+(?:an|für)\s+(?:die|das|den)\s+"
            r"(?:ki|sprachmodell|modell|assistenten)\b",
            r"\bdu\s+bist\s+(?:jetzt\s+)?(?:eine?\s+)?(?:ki|sprachmodell|künstliche\s+intelligenz)\b",
            r"\bsystem-?(?:prompt|anweisung)\b",
        )
    ),
    re.IGNORECASE,
)

# Every alternative of MARKERS holds one of these once case-folded with whitespace runs as one space.
# Looking for them is a few substring scans in C; the regex runs only on a page that holds one.
_KEYWORDS = (
    "ignor", "disregard", "forget", "overrid", "note to", "reading", "processing", "extracting",
    "you are", "system", "instruction", "assistant", "<|im_", "inst]", "<<sys", "<</sys",
    "talimat", "yapay zek", "dil modeli", "sistem",
    "vergiss", "vergessen", "missacht", "hinweis", "nachricht", "notiz", "anweisung", "du bist",
)  # fmt: skip

# A paragraph: whole non-blank lines up to a line holding nothing but whitespace (or a page's end).
_PARAGRAPH = re.compile(r"[^\n]*\S[^\n]*(?:\n[ \t\r\v]*\S[^\n]*)*")


@dataclass(frozen=True)
class Passage:
    """Text addressed to the model: its place on its page and the phrase that gave it away."""

    page: int
    start: int
    end: int
    marker: str

    @property
    def range(self) -> tuple[int, int, int]:
        return (self.page, self.start, self.end)

    def to_json(self) -> dict[str, Any]:
        return {"page": self.page, "start": self.start, "end": self.end, "marker": self.marker}


def instruction_passages(pages: Sequence[str]) -> list[Passage]:
    """Every passage of every page that addresses the model, in reading order."""
    found: list[Passage] = []
    for number, text in enumerate(pages, start=1):
        if not _may_address_model(text):  # the common case
            continue
        for start, end, marker in _markers_by_paragraph(text):
            line_start = max(text.rfind("\n", 0, marker.start()) + 1, start)
            found.append(Passage(number, line_start, end, " ".join(marker.group().split())))
    return found


def _markers_by_paragraph(text: str) -> Iterator[tuple[int, int, re.Match[str]]]:
    """Each paragraph of ``text`` holding a phrase, with the first phrase a search of it alone finds.

    The phrase regex is slow (about a third of a microsecond a character), so the page is scanned
    about once instead of once whole and once more paragraph by paragraph. A paragraph ends at a
    line break or the page's end, where a word-boundary test answers the same for the paragraph as
    for the page, and MARKERS tests nothing else about what follows; so a search of the paragraph
    alone only loses the page's matches that run past it. Hence a paragraph ending before the
    page's next phrase starts holds none, and that phrase, when it also ends within the paragraph,
    is the one the search of the paragraph alone finds.
    """
    ahead = MARKERS.search(text)  # the first phrase starting at or after the current paragraph
    for paragraph in _PARAGRAPH.finditer(text):
        if ahead is None:
            return
        start, end = paragraph.span()
        if ahead.start() < start:
            ahead = MARKERS.search(text, start)
            if ahead is None:
                return
        if ahead.start() >= end:
            continue
        marker = ahead if ahead.end() <= end else MARKERS.search(text, start, end)
        if marker is not None:
            yield start, end, marker


def _may_address_model(text: str) -> bool:
    # casefold turns a Turkish İ into i + U+0307; without the dot it is the i the keywords have.
    # It leaves a dotless ı as it is, which the phrases' case-blind match takes for an i.
    folded = " ".join(text.casefold().replace("\u0307", "").replace("ı", "i").split())
    return any(keyword in folded for keyword in _KEYWORDS)
