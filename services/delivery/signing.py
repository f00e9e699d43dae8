"""Standard Webhooks v1 signing (DESIGN §5.9): secrets, stable delivery ids and signature headers.

The signature itself is the partner SDK's (``fatura_sdk.webhooks``): one implementation of the
scheme signs here and verifies at the receivers. This module adds the sender's policy (what a
secret may be) and the stable delivery id. Pure functions: the caller serializes the body once
and signs and sends exactly those bytes.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import uuid
from collections.abc import Iterable

from fatura_sdk import webhooks

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32

# Namespace of delivery ids: uuid5(namespace, f"{event_id}/{endpoint_id}") is the same for every
# retry and every resend of one event to one endpoint, which is what lets a receiver dedup.
_DELIVERY_NAMESPACE = uuid.UUID("5b0c3f7e-3d1a-4e59-9a57-6f1d2c0e8a41")


class BadSecret(ValueError):
    """A webhook secret that is not ``whsec_<base64 of 24-64 bytes>``."""


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode("ascii")


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret: the base64-decoded part after the prefix."""
    if not secret.startswith(SECRET_PREFIX):
        raise BadSecret("a webhook secret starts with 'whsec_'")
    try:
        key = base64.b64decode(secret[len(SECRET_PREFIX) :], validate=True)
    except ValueError:
        raise BadSecret("a webhook secret is base64 after 'whsec_'") from None
    if not 24 <= len(key) <= 64:
        raise BadSecret("a webhook secret holds 24 to 64 bytes")
    return key


def key_id(secret: str) -> str:
    """A short, non-secret name for a secret (shown in listings; never on the wire)."""
    return "key_" + hashlib.sha256(secret.encode("ascii")).hexdigest()[:12]


def delivery_id(event_id: uuid.UUID, endpoint_id: uuid.UUID) -> uuid.UUID:
    return uuid.uuid5(_DELIVERY_NAMESPACE, f"{event_id}/{endpoint_id}")


def headers(secrets_in_force: Iterable[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The request headers of one attempt: one signature per secret in force (several while a secret
    rotates), made by the partner SDK's own signer, so sender and receivers share one
    implementation of the scheme."""
    in_force = list(secrets_in_force)
    if not in_force:
        raise BadSecret("an endpoint needs at least one secret in force to sign a delivery")
    for secret in in_force:
        secret_key(secret)  # our stricter policy: whsec_, base64, 24-64 bytes
    return webhooks.sign_headers(in_force, msg_id, body, timestamp=timestamp)
