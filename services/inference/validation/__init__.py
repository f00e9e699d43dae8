"""Result validation: the versioned policy that decides whether a model's invoice extraction
succeeded, needs a human review (with machine-readable reasons), or is a model error.

Pure: no I/O but reading ``invoice.v1.schema.json`` once. The inference worker calls ``validate``.
Reason codes: ``arithmetic_line``, ``arithmetic_subtotal``, ``arithmetic_total``,
``currency_not_allowed``, ``iban_checksum``, ``supplier_unknown``, ``iban_mismatch``,
``iban_ambiguous``, ``evidence_missing``, ``evidence_in_instruction``. Model error classes:
``broken_json``, ``schema_violation``, ``too_large``. ``resolve_span`` gives the text an evidence
span names, for anything that shows evidence to a person.
"""

from ._instructions import Passage, instruction_passages
from ._model import POLICY_VERSION, MasterSupplier, Reason, ValidationContext, Verdict
from ._money import minor_unit, tolerance
from ._parties import normalize_tax_id
from ._policy import DEFAULT_MAX_BYTES, validate
from ._spans import PAGE_BREAK, resolve_span, span_problem, split_pages

REASON_CODES = (
    "arithmetic_line",
    "arithmetic_subtotal",
    "arithmetic_total",
    "currency_not_allowed",
    "iban_checksum",
    "supplier_unknown",
    "iban_mismatch",
    "iban_ambiguous",
    "evidence_missing",
    "evidence_in_instruction",
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "PAGE_BREAK",
    "POLICY_VERSION",
    "REASON_CODES",
    "MasterSupplier",
    "Passage",
    "Reason",
    "ValidationContext",
    "Verdict",
    "instruction_passages",
    "minor_unit",
    "normalize_tax_id",
    "resolve_span",
    "span_problem",
    "split_pages",
    "tolerance",
    "validate",
]
