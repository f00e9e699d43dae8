"""Result validation: the versioned policy that decides whether a model's invoice extraction
succeeded, needs a human review (with machine-readable reasons), or is a model error.

Pure: no I/O but reading ``invoice.v1.schema.json`` once. The inference worker calls ``validate``.
Reason codes: ``arithmetic_line``, ``arithmetic_subtotal``, ``arithmetic_total``,
``currency_not_allowed``, ``iban_checksum``, ``supplier_unknown``, ``iban_mismatch``,
``iban_ambiguous``, ``evidence_missing``. Model error classes: ``broken_json``,
``schema_violation``, ``too_large``.
"""

from ._model import POLICY_VERSION, MasterSupplier, Reason, ValidationContext, Verdict
from ._money import minor_unit, tolerance
from ._parties import normalize_tax_id
from ._policy import DEFAULT_MAX_BYTES, validate

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
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "POLICY_VERSION",
    "REASON_CODES",
    "MasterSupplier",
    "Reason",
    "ValidationContext",
    "Verdict",
    "minor_unit",
    "normalize_tax_id",
    "tolerance",
    "validate",
]
