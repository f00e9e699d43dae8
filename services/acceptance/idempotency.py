"""Idempotency keys and request hashes (DESIGN §5.1).

The key is tenant-scoped. The hash covers everything that changes the result: the document's
identity and content digest, the schema, the model policy, the validation policy and the options.
Priority and deadline shape scheduling, not the result, so a retry that changes only them gets
the original job back.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from services.common.api.errors import ApiError

MAX_KEY_LENGTH = 255
_KEY = re.compile(r"^[\x21-\x7e]+$")  # visible ASCII, no spaces


def validate_key(raw: str | None) -> str:
    if raw is None or raw == "":
        raise ApiError(
            "the Idempotency-Key header is required on this request", code="idempotency_key_missing"
        )
    if len(raw) > MAX_KEY_LENGTH:
        raise ApiError(
            f"the Idempotency-Key header is longer than {MAX_KEY_LENGTH} characters",
            code="idempotency_key_invalid",
        )
    if not _KEY.match(raw):
        raise ApiError(
            "the Idempotency-Key header may hold only visible ASCII characters",
            code="idempotency_key_invalid",
        )
    return raw


def request_hash(
    *,
    document_key: str,
    object_version: str,
    schema: str,
    model_policy: str,
    policy_version: str,
    options: Mapping[str, Any],
) -> str:
    canonical = _CANONICAL.encode(
        {
            "document": document_key,
            "object_version": object_version,
            "schema": schema,
            "model_policy": model_policy,
            "policy_version": policy_version,
            "options": options,
        }
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


# What ``json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=True)`` builds at every
# call, built once.
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True)
