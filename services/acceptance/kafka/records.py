"""An extraction request as a Kafka record, parsed into what the HTTP path accepts, or poison.

The record's value is the JSON body of ``POST /v1/extraction-jobs`` with two fields more,
``tenant_id`` and ``idempotency_key`` (the header over HTTP); its key is ``<tenant_id>:<invoice
id>``, so one tenant's invoice always lands on the same partition. Anything else is poison: no
retry can fix it, so it goes to the dead-letter topic with its reason. No I/O here.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from services.acceptance.idempotency import validate_key
from services.acceptance.requests import CreateJob, RequestParser
from services.common.api.errors import ApiError
from services.common.failures import Poison

# The record value's own fields; the rest is the HTTP body.
_ENVELOPE = ("tenant_id", "idempotency_key")


@dataclass(frozen=True)
class IngressRequest:
    tenant_id: uuid.UUID
    idempotency_key: str
    job: CreateJob


def parse(parser: RequestParser, key: bytes | None, value: bytes | None) -> IngressRequest:
    """The request a record carries; raises ``Poison`` naming what is wrong with it."""
    if value is None:
        raise Poison("malformed", "the record has no value")
    try:
        body: Any = json.loads(value)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Poison("malformed", f"the record's value is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise Poison("malformed", "the record's value is not a JSON object")
    try:
        tenant_id = uuid.UUID(str(body.get("tenant_id")))
    except ValueError:
        raise Poison("malformed", "tenant_id is missing or not a UUID") from None
    raw_key = body.get("idempotency_key")
    try:
        idempotency_key = validate_key(raw_key if isinstance(raw_key, str) else None)
    except ApiError as exc:
        raise Poison("malformed", f"idempotency_key: {exc.message}") from None
    _check_record_key(key, tenant_id)
    try:
        job = parser.create_job({k: v for k, v in body.items() if k not in _ENVELOPE})
    except ApiError as exc:
        raise Poison(exc.code, exc.message) from None
    return IngressRequest(tenant_id, idempotency_key, job)


def _check_record_key(key: bytes | None, tenant_id: uuid.UUID) -> None:
    if key is None:
        raise Poison("malformed", "the record has no key; it should be <tenant_id>:<invoice id>")
    tenant_part, sep, invoice = key.decode("utf-8", errors="replace").partition(":")
    if not sep or not invoice:
        raise Poison("malformed", "the record key should be <tenant_id>:<invoice id>")
    try:
        same = uuid.UUID(tenant_part) == tenant_id
    except ValueError:
        same = False
    if not same:
        raise Poison("tenant_mismatch", "the record key's tenant is not the tenant_id of its value")
