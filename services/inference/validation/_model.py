"""The values validation works on: what it is given (context) and what it decides (verdict)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

# Bump whenever a rule, a tolerance or the schema changes what a result may be: the version is
# stored with every result, so a reviewer can tell which rules judged it.
POLICY_VERSION = "invoice-policy.v2"  # v2: evidence is a {page, start, end} span

Outcome = Literal["succeeded", "review_required", "model_error"]
ModelErrorClass = Literal["broken_json", "schema_violation", "too_large"]


@dataclass(frozen=True)
class MasterSupplier:
    """One row of the tenant's supplier master data."""

    tax_id: str
    name: str
    iban: str | None
    currency: str | None


@dataclass(frozen=True)
class ValidationContext:
    """Everything the rules compare a result against; built by the worker from the database."""

    source_text: str  # the document text the model read: its pages separated by form feeds
    allowed_currencies: frozenset[str]  # the tenant's
    suppliers: Mapping[str, MasterSupplier]  # keyed by normalize_tax_id(tax_id)


@dataclass(frozen=True)
class Reason:
    """Why a result needs a human: a stable code, the JSON Pointer of the field, words, and data."""

    code: str
    field: str | None
    message: str
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message, "detail": dict(self.detail)}


@dataclass(frozen=True)
class Verdict:
    """The decision on one model answer.

    ``succeeded``: every rule holds. ``review_required``: the answer is a well-formed invoice but
    at least one rule fails (``reasons`` says which). ``model_error``: the answer is not a usable
    invoice at all (``error_class`` says why); the worker may retry it within the budget.
    """

    outcome: Outcome
    result: dict[str, Any] | None
    reasons: tuple[Reason, ...]
    error_class: ModelErrorClass | None
    error_message: str | None
    policy_version: str = POLICY_VERSION

    @classmethod
    def model_error(cls, error_class: ModelErrorClass, message: str) -> Verdict:
        return cls("model_error", None, (), error_class, message)

    @classmethod
    def judged(cls, result: dict[str, Any], reasons: tuple[Reason, ...]) -> Verdict:
        return cls("review_required" if reasons else "succeeded", result, reasons, None, None)

    @property
    def review_codes(self) -> list[str]:
        """The distinct reason codes, in the order the rules found them."""
        return list(dict.fromkeys(reason.code for reason in self.reasons))
