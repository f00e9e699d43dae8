"""Idempotency keys and the request hash."""

from __future__ import annotations

from typing import Any

import pytest

from services.acceptance.idempotency import request_hash, validate_key
from services.common.api.errors import ApiError

BASE: dict[str, Any] = {
    "document_key": "inline",
    "object_version": "ab" * 32,
    "schema": "invoice.v1",
    "model_policy": "default",
    "policy_version": "invoice-policy.v1",
    "options": {"language": "tr"},
}


def test_valid_keys_pass_through_unchanged() -> None:
    assert validate_key("order-42/retry#1") == "order-42/retry#1"
    assert validate_key("k" * 255) == "k" * 255


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (None, "idempotency_key_missing"),
        ("", "idempotency_key_missing"),
        ("k" * 256, "idempotency_key_invalid"),
        ("has space", "idempotency_key_invalid"),
        ("ünicode", "idempotency_key_invalid"),
    ],
)
def test_unusable_keys_are_400(raw: str | None, code: str) -> None:
    with pytest.raises(ApiError) as refused:
        validate_key(raw)
    assert refused.value.status == 400 and refused.value.code == code


def test_the_hash_is_stable_and_ignores_option_order() -> None:
    reordered = {**BASE, "options": {"language": "tr"}}
    assert request_hash(**BASE) == request_hash(**reordered)
    assert len(request_hash(**BASE)) == 64


@pytest.mark.parametrize(
    "change",
    [
        {"document_key": "doc@2"},
        {"object_version": "cd" * 32},
        {"schema": "invoice.v2"},
        {"model_policy": "cheap"},
        {"policy_version": "invoice-policy.v2"},
        {"options": {"language": "de"}},
        {"options": {}},
    ],
)
def test_everything_that_changes_the_result_changes_the_hash(change: dict[str, Any]) -> None:
    assert request_hash(**{**BASE, **change}) != request_hash(**BASE)
