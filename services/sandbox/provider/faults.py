"""Faults set at run time through ``/admin/faults``, and what each does to an answer.

One fault is active at a time. ``count`` answers are faulted (null: until cleared), each with
``probability``. The transport faults (429 storm, 5xx, hang, slow stream, error frame) are acted
out by the HTTP layer; the content faults below change the extraction itself.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
import re
from dataclasses import asdict, dataclass
from typing import Any

from services.sandbox.provider.iban import TEMPLATES, find_ibans, make_iban
from services.sandbox.provider.labels import INJECTION
from services.sandbox.provider.spans import Document, Located, located_paragraphs

MODES = (
    "none",
    "rate_limit_storm",
    "server_error",
    "hang_before_headers",
    "slow_stream",
    "broken_json",
    "hallucinated_iban",
    "obey_injection",
    "error_frame",
)
DEFAULT_DELAY_S = {"hang_before_headers": 600.0, "slow_stream": 1.0}


class FaultError(ValueError):
    """A fault request the simulator cannot act on (400)."""


@dataclass(frozen=True)
class Fault:
    mode: str
    count: int | None = None
    probability: float = 1.0
    retry_after: int = 1
    delay_s: float = 0.0
    status: int = 503
    # The error text of a server_error answer, in place of the default: a real provider's words may
    # name its own hosts, which the caller must keep from its tenants.
    message: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def parse_fault(body: Any) -> Fault:
    if not isinstance(body, dict):
        raise FaultError("the body must be a JSON object")
    unknown = set(body) - {"mode", "count", "probability", "retry_after", "delay_s", "status", "message"}
    if unknown:
        raise FaultError(f"unknown fields: {', '.join(sorted(unknown))}")
    mode = body.get("mode")
    if mode not in MODES:
        raise FaultError(f"`mode` must be one of {', '.join(MODES)}")
    count = body.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise FaultError("`count` must be a positive integer or null (until cleared)")
    probability = _number(body, "probability", 1.0, 0.0, 1.0)
    retry_after = _number(body, "retry_after", 1, 0, 86_400)
    delay_s = _number(body, "delay_s", DEFAULT_DELAY_S.get(mode, 0.0), 0.0, 3_600.0)
    status = body.get("status", 503)
    if isinstance(status, bool) or not isinstance(status, int) or not 500 <= status <= 599:
        raise FaultError("`status` must be an integer from 500 to 599")
    message = body.get("message")
    if message is not None and (not isinstance(message, str) or not 1 <= len(message) <= 500):
        raise FaultError("`message` must be a string of 1 to 500 characters")
    return Fault(mode, count, float(probability), int(retry_after), float(delay_s), status, message)


def _number(body: dict[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise FaultError(f"`{name}` must be a number from {lo:g} to {hi:g}")
    return float(value)


class FaultBoard:
    """The active fault and how many more answers it may still fault."""

    def __init__(self, rng: random.Random | None = None):
        self._rng = rng or random.Random()
        self.active: Fault | None = None
        self.remaining: int | None = None
        self.applied = 0

    def set(self, fault: Fault) -> None:
        if fault.mode == "none":
            self.clear()
            return
        self.active, self.remaining, self.applied = fault, fault.count, 0

    def clear(self) -> None:
        self.active, self.remaining = None, None

    def draw(self) -> Fault | None:
        """The fault for the next answer, if any; spends one of its ``count``."""
        fault = self.active
        if fault is None or self._rng.random() >= fault.probability:
            return None
        self.applied += 1
        if self.remaining is not None:
            self.remaining -= 1
            if self.remaining <= 0:
                self.clear()
        return fault

    def give_back(self, fault: Fault) -> None:
        """Return a drawn fault unused (the request was refused before any answer)."""
        self.applied -= 1
        if self.active is fault and self.remaining is not None:
            self.remaining += 1
        elif self.active is None and fault.count is not None:
            self.active, self.remaining = fault, 1

    def to_json(self) -> dict[str, Any]:
        if self.active is None:
            return {"mode": "none", "active": None, "remaining": None, "applied": self.applied}
        return {
            "mode": self.active.mode,
            "active": self.active.to_json(),
            "remaining": self.remaining,
            "applied": self.applied,
        }


def broken_json(content: str) -> str:
    """A 200 whose content is cut off halfway: not JSON any more."""
    return content[: max(1, len(content) // 2)]


def hallucinate_iban(result: dict[str, Any], text: str) -> dict[str, Any]:
    """The same answer with an invented, checksum-valid IBAN that the text does not contain, and a
    made-up span for it: schema-valid, and wrong."""
    changed = copy.deepcopy(result)
    country = (result["supplier"].get("iban") or result["supplier"].get("tax_id") or "")[:2]
    if country not in TEMPLATES:
        country = "TR" if re.search(r"[ğışİŞĞ]", text) else "DE"
    compact_text = re.sub(r"\s", "", text)
    seed = hashlib.sha256(text.encode()).hexdigest()
    iban = make_iban(country, seed)
    while iban in compact_text:  # never one that happens to be in the text
        seed = hashlib.sha256(seed.encode()).hexdigest()
        iban = make_iban(country, seed)
    changed["supplier"]["iban"] = iban
    changed["evidence"]["/supplier/iban"] = _made_up_span(Document(text))
    return changed


def _made_up_span(doc: Document) -> dict[str, int]:
    """Where a model inventing an IBAN may say it read it: the first line naming an IBAN, else the
    first line with any text. That line never states the invented IBAN."""
    filled = [i for i, line in enumerate(doc.lines) if line.strip()]
    if not filled:
        return {"page": 1, "start": 0, "end": 1}
    index = next((i for i in filled if "iban" in doc.lines[i].lower()), filled[0])
    line = doc.lines[index]
    start = len(line) - len(line.lstrip())
    return doc.span(doc.in_line(index, start, len(line.rstrip())))


def obey_injection(result: dict[str, Any], text: str) -> dict[str, Any]:
    """The answer a model that follows the document's instructions gives: the IBAN the injected
    paragraph asks for, with the span where that paragraph states it. Without such a paragraph,
    the honest answer."""
    for paragraph in located_paragraphs(text):
        if not INJECTION.search(paragraph.text):
            continue
        asked = find_ibans(paragraph.text)
        if asked:
            changed = copy.deepcopy(result)
            changed["supplier"]["iban"] = asked[0].value
            where = Located(asked[0].quote, paragraph.start + asked[0].start)
            changed["evidence"]["/supplier/iban"] = Document(text).span(where)
            return changed
    return result


def dumps(result: dict[str, Any]) -> str:
    return json.dumps(result, ensure_ascii=False)
