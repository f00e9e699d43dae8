"""The validation policy: one function from the model's answer to a verdict.

Order matters only between stages: a too-large, unparsable or schema-invalid answer is a model
error and no rule runs on it. The business rules then all run, so a reviewer sees every reason at
once instead of fixing one and meeting the next.
"""

from __future__ import annotations

from ._evidence import evidence_reasons
from ._model import Reason, ValidationContext, Verdict
from ._money import arithmetic_reasons
from ._parse import parse_invoice
from ._parties import currency_reasons, iban_reasons

DEFAULT_MAX_BYTES = 262144


def validate(content: str, context: ValidationContext, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Verdict:
    """Judge one model answer (the message content) against the policy ``POLICY_VERSION``."""
    parsed = parse_invoice(content, max_bytes)
    if isinstance(parsed, Verdict):
        return parsed
    reasons: list[Reason] = [
        *arithmetic_reasons(parsed),
        *currency_reasons(parsed, context),
        *iban_reasons(parsed, context),
        *evidence_reasons(parsed, context.source_text),
    ]
    return Verdict.judged(parsed, tuple(reasons))
