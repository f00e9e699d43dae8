"""IBANs in document text: finding them as printed (grouped by spaces), checking and making them.

The simulator reads IBANs, and under the ``hallucinated_iban`` fault invents one whose checksum is
valid, so that only a check against the source text and the master data can catch it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from stdnum import iban as stdnum_iban

# ISO 13616 lengths of the countries an invoice here is likely to name; others keep what was printed.
LENGTHS = {
    "AT": 20, "BE": 16, "CH": 21, "CZ": 24, "DE": 22, "DK": 18, "ES": 24, "FI": 18, "FR": 27,
    "GB": 22, "GR": 27, "IE": 22, "IT": 27, "LU": 20, "NL": 18, "NO": 15, "PL": 28, "PT": 25,
    "SE": 24, "TR": 26,
}  # fmt: skip

# Two letters, two check digits, then groups of up to four letters/digits separated by one space.
CANDIDATE = re.compile(r"(?<![A-Za-z0-9])([A-Z]{2}\d{2}(?: ?[A-Z0-9]{1,4}){3,8})(?![A-Za-z0-9])")


@dataclass(frozen=True)
class FoundIban:
    value: str  # compact: letters and digits only
    quote: str  # exactly as printed
    start: int  # where in the searched text

    @property
    def end(self) -> int:
        return self.start + len(self.quote)


def find_ibans(text: str) -> list[FoundIban]:
    """Every IBAN-shaped string in reading order (checksum not checked: a wrong one is still stated)."""
    found: list[FoundIban] = []
    for match in CANDIDATE.finditer(text):
        printed = match.group(1)
        compact = printed.replace(" ", "")
        length = LENGTHS.get(compact[:2])
        if length is not None:
            if len(compact) < length:
                continue
            printed = _prefix_with(printed, length)
            compact = compact[:length]
        if len(compact) >= 14:
            found.append(FoundIban(compact, printed, match.start(1)))
    return found


def _prefix_with(printed: str, characters: int) -> str:
    """The shortest prefix of ``printed`` holding ``characters`` non-space characters."""
    seen = 0
    for index, char in enumerate(printed):
        if char != " ":
            seen += 1
            if seen == characters:
                return printed[: index + 1]
    return printed


def is_valid(iban: str) -> bool:
    """ISO 13616: checksum and each country's BBAN structure (and national check digits)."""
    return bool(stdnum_iban.is_valid(iban))


# One valid IBAN per country to shape invented ones on: the BBAN structure differs by country.
TEMPLATES = {
    "DE": "DE89370400440532013000",
    "GB": "GB29NWBK60161331926819",
    "IE": "IE29AIBK93115212345678",
    "FR": "FR7630006000011234567890189",
    "NL": "NL91ABNA0417164300",
    "TR": "TR330006100519786457841326",
}


def make_iban(country: str, seed: str) -> str:
    """A valid IBAN for ``country`` (else DE) whose account digits are drawn from ``seed``."""
    template = TEMPLATES.get(country.upper(), TEMPLATES["DE"])
    rng = random.Random(seed)
    while True:
        account = "".join(str(rng.randrange(10)) for _ in range(8))
        body = template[4:-8] + account
        candidate = template[:2] + stdnum_iban.calc_check_digits(template[:2] + "00" + body) + body
        if is_valid(candidate):  # some countries carry a national check digit too; draw again
            return candidate
