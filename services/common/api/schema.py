"""JSON Schema validation of request bodies, with the regular-expression dialect the schema means.

JSON Schema patterns are ECMA-262 regular expressions, where ``$`` (without the multiline flag)
matches only at the end of the input. Python's ``re`` also lets ``$`` match before one final
newline, so ``"<uuid>\\n"`` would pass ``^...$`` and then break whatever parses the value. Every
route validates with ``RequestValidator``, whose ``pattern`` keyword gives ``$`` its ECMA meaning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError


@lru_cache(maxsize=256)
def _compile(pattern: str) -> re.Pattern[str]:
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _pattern(
    validator: Any, pattern: str, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compile(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


RequestValidator: Any = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, {"pattern": _pattern}
)
