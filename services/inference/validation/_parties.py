"""Who gets paid, and in what: currency, supplier master data and IBAN rules.

A wrong IBAN is the costly error of invoice extraction (money leaves to someone else), and it is
also what a hallucinating model or an injected instruction produces, so the IBAN is checked four
ways: its ISO 13616 checksum, the supplier's IBAN in master data, its evidence in the text (see
``_evidence``), and whether the text names more than one account at all.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from stdnum import iban as iso13616
from stdnum.exceptions import InvalidChecksum, InvalidComponent, InvalidFormat, InvalidLength, ValidationError

from services.common.taxids import normalize_tax_id as normalize_tax_id  # shared with supplier import

from ._model import Reason, ValidationContext

# Country code, check digits, then the BBAN in groups separated by at most one space (no line breaks),
# not preceded by a letter or digit. That test follows the first letter, as a two-character
# look-behind, because a pattern opening with a letter lets the regex engine skip to the next
# upper-case letter, where one opening with a look-behind is tried at every character.
_IBAN_IN_TEXT = re.compile(r"[A-Z](?<![A-Z0-9].)[A-Z][0-9]{2}(?:[ \u00a0]?[A-Z0-9]){10,32}")
_NON_ALNUM = re.compile(r"[^0-9A-Z]")


def compact_iban(raw: str) -> str:
    """An IBAN without spaces or punctuation, upper-case, as ISO 13616 compares it."""
    return _NON_ALNUM.sub("", unicodedata.normalize("NFKC", raw).upper())


def iban_problem(value: str) -> str | None:
    """None for a valid IBAN, else what is wrong: checksum, length, format or component."""
    return _compact_problem(compact_iban(value))


# A tenant's suppliers are paid into the same accounts invoice after invoice, so the same IBANs
# come back job after job; python-stdnum's full check (its bank registry lookup included) is most
# of what validation spends on IBANs. A bounded cache: a stream of made-up IBANs only evicts.
@lru_cache(maxsize=4096)
def _compact_problem(compact: str) -> str | None:
    """``iban_problem`` of an IBAN already compacted (``compact_iban``)."""
    try:
        iso13616.validate(compact)
    except InvalidChecksum:
        return "checksum"
    except InvalidLength:
        return "length"
    except InvalidFormat:
        return "format"
    except InvalidComponent:
        return "component"
    except ValidationError:
        return "invalid"
    return None


def ibans_in_text(text: str) -> list[str]:
    """The distinct valid IBANs the text states, in order of appearance.

    A run of IBAN-shaped characters may swallow a following upper-case word ("… 3000 BIC …"), so
    the IBAN is its longest prefix that passes ISO 13616.
    """
    found: dict[str, None] = {}
    for match in _IBAN_IN_TEXT.finditer(unicodedata.normalize("NFKC", text)):
        run = compact_iban(match.group(0))
        longest = min(len(run), 34)
        for end in range(longest, 14, -1):
            # Usually the whole run is the IBAN; a shorter prefix must pass the cheap checksum
            # before the full check, which costs eight times more even when it fails there.
            if (end == longest or _checksum_holds(run[:end])) and _compact_problem(run[:end]) is None:
                found[run[:end]] = None
                break
    return list(found)


# ISO 7064 MOD 97-10 as ISO 13616 applies it, letters read as 10 to 35.
_LETTER_DIGITS = {ord(letter): str(value) for value, letter in enumerate(string.ascii_uppercase, start=10)}


def _checksum_holds(compact: str) -> bool:
    """The checksum test python-stdnum's IBAN check starts with, for a string of 0-9 and A-Z (as
    compact_iban leaves it): a string failing it fails the full check."""
    return int((compact[4:] + compact[:4]).translate(_LETTER_DIGITS)) % 97 == 1


def currency_reasons(invoice: Mapping[str, Any], context: ValidationContext) -> list[Reason]:
    currency = invoice["currency"]
    if currency in context.allowed_currencies:
        return []
    allowed = sorted(context.allowed_currencies)
    return [
        Reason(
            "currency_not_allowed",
            "/currency",
            f"currency {currency} is not among the tenant's allowed ones: {', '.join(allowed) or 'none'}",
            {"currency": currency, "allowed": allowed},
        )
    ]


def iban_reasons(invoice: Mapping[str, Any], context: ValidationContext) -> list[Reason]:
    """``iban_checksum``, ``supplier_unknown``, ``iban_mismatch`` and ``iban_ambiguous``."""
    reasons: list[Reason] = []
    supplier = invoice["supplier"]
    extracted: str | None = supplier["iban"]
    stated = compact_iban(extracted) if extracted is not None else None
    in_text = ibans_in_text(context.source_text)
    if extracted is not None:
        # An IBAN the text states has passed ISO 13616 already (usually the extracted one): the
        # check is not run twice on one string.
        problem = None if stated in in_text else iban_problem(extracted)
        if problem is not None:
            reasons.append(
                Reason(
                    "iban_checksum",
                    "/supplier/iban",
                    f"IBAN {extracted} is not a valid ISO 13616 IBAN ({problem})",
                    {"iban": extracted, "problem": problem},
                )
            )
    tax_id = normalize_tax_id(supplier["tax_id"])
    master = context.suppliers.get(tax_id)
    if master is None:
        reasons.append(
            Reason(
                "supplier_unknown",
                "/supplier/tax_id",
                f"no supplier with tax id {supplier['tax_id']} in the tenant's master data",
                {"tax_id": tax_id},
            )
        )
    else:
        expected = compact_iban(master.iban) if master.iban else None
        # A null IBAN is only fine when master data has none; an IBAN master data does not know
        # is a new bank account, exactly what payment fraud looks like.
        if stated != expected:
            reasons.append(
                Reason(
                    "iban_mismatch",
                    "/supplier/iban",
                    f"IBAN {extracted or 'null'} differs from the master data of {master.name} "
                    f"({master.iban or 'no IBAN'})",
                    {"iban": stated, "master_data_iban": expected, "tax_id": tax_id},
                )
            )
    if len(in_text) > 1:
        reasons.append(
            Reason(
                "iban_ambiguous",
                "/supplier/iban",
                f"the document states {len(in_text)} different IBANs; which one to pay is a human decision",
                {"ibans": in_text},
            )
        )
    return reasons
