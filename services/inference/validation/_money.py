"""The arithmetic rules: line amounts, the subtotal and the total, in exact decimals.

Each stated figure is compared with the figure computed from the others. The tolerance is half a
minor unit of the currency per rounding step between them, because that is exactly the error
correct rounding can introduce:

- a line amount is one rounding of quantity times unit price: 1 step;
- the subtotal is compared with the sum of n already-rounded line amounts: n steps (the issuer
  may have summed the unrounded products and rounded once);
- the total is compared with subtotal + tax_total, two rounded figures: 2 steps.

A difference equal to the tolerance passes; anything above it fails. Money is never a float.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Context, Decimal, localcontext
from typing import Any

from ._model import Reason

# ISO 4217 minor units that are not 2. Unknown codes fall back to 2, the common case.
MINOR_UNITS: Mapping[str, int] = {
    "BIF": 0, "CLP": 0, "DJF": 0, "GNF": 0, "ISK": 0, "JPY": 0, "KMF": 0, "KRW": 0, "PYG": 0,
    "RWF": 0, "UGX": 0, "UYI": 0, "VND": 0, "VUV": 0, "XAF": 0, "XOF": 0, "XPF": 0,
    "BHD": 3, "IQD": 3, "JOD": 3, "KWD": 3, "LYD": 3, "OMR": 3, "TND": 3,
    "CLF": 4, "UYW": 4,
}  # fmt: skip

# Schema numbers have at most 15 integer and 6 fraction digits, so a product has at most 42 digits
# and a sum of 500 of them 45: this precision makes every operation below exact.
_EXACT = Context(prec=64)


def minor_unit(currency: str) -> int:
    """Digits after the decimal point in the currency's smallest unit (JPY 0, EUR 2, KWD 3)."""
    return MINOR_UNITS.get(currency, 2)


def tolerance(currency: str, steps: int = 1) -> Decimal:
    """Half a minor unit of ``currency`` per rounding step."""
    return Decimal(steps) * Decimal(5).scaleb(-minor_unit(currency) - 1)


def within(stated: Decimal, computed: Decimal, currency: str, steps: int = 1) -> bool:
    """Whether ``stated`` equals ``computed`` up to the rounding ``steps`` allow."""
    with localcontext(_EXACT):
        return abs(stated - computed) <= tolerance(currency, steps)


def arithmetic_reasons(invoice: Mapping[str, Any]) -> list[Reason]:
    """``arithmetic_line`` per wrong line, then ``arithmetic_subtotal``, then ``arithmetic_total``."""
    currency = str(invoice["currency"])
    reasons: list[Reason] = []
    amounts: list[Decimal] = []
    with localcontext(_EXACT):
        # within(amount, product, currency) for each line, with its one-step tolerance taken once
        line_tolerance = tolerance(currency)
        for index, line in enumerate(invoice["lines"]):
            quantity, unit_price, amount = (
                Decimal(line["quantity"]),
                Decimal(line["unit_price"]),
                Decimal(line["amount"]),
            )
            amounts.append(amount)
            product = quantity * unit_price
            if not abs(amount - product) <= line_tolerance:
                reasons.append(
                    _mismatch(
                        "arithmetic_line",
                        f"/lines/{index}/amount",
                        f"line {index + 1}: amount {amount} is not quantity {quantity} x unit price "
                        f"{unit_price} = {product}",
                        stated=amount,
                        computed=product,
                        currency=currency,
                        steps=1,
                    )
                )
        subtotal, tax_total, total = (Decimal(invoice[k]) for k in ("subtotal", "tax_total", "total"))
        lines_sum = sum(amounts, Decimal(0))
        if not within(subtotal, lines_sum, currency, len(amounts)):
            reasons.append(
                _mismatch(
                    "arithmetic_subtotal",
                    "/subtotal",
                    f"subtotal {subtotal} is not the sum of the line amounts, {lines_sum}",
                    stated=subtotal,
                    computed=lines_sum,
                    currency=currency,
                    steps=len(amounts),
                )
            )
        expected_total = subtotal + tax_total
        if not within(total, expected_total, currency, 2):
            reasons.append(
                _mismatch(
                    "arithmetic_total",
                    "/total",
                    f"total {total} is not subtotal {subtotal} + tax {tax_total} = {expected_total}",
                    stated=total,
                    computed=expected_total,
                    currency=currency,
                    steps=2,
                )
            )
    return reasons


def _mismatch(
    code: str,
    field: str,
    message: str,
    *,
    stated: Decimal,
    computed: Decimal,
    currency: str,
    steps: int,
) -> Reason:
    with localcontext(_EXACT):
        difference = stated - computed
    detail = {
        "stated": str(stated),
        "computed": str(computed),
        "difference": str(difference),
        "tolerance": str(tolerance(currency, steps)),
        "currency": currency,
    }
    return Reason(code, field, message, detail)
