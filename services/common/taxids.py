"""Tax ids as master data keys them: one normalization for supplier import and result validation."""

from __future__ import annotations

import re
import unicodedata

_NON_ALNUM = re.compile(r"[^0-9A-Z]")


def normalize_tax_id(raw: str) -> str:
    """A tax id as master data keys it: upper-case letters and digits only ("94-1234567" → "941234567")."""
    return _NON_ALNUM.sub("", unicodedata.normalize("NFKC", raw).upper())
