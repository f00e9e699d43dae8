"""Standard Webhooks v1 signatures: verify what Fatura sends, and sign the same way (for tests and senders).

The signed bytes are ``f"{webhook_id}.{timestamp}.".encode() + raw_body``, HMAC-SHA256 with the
endpoint secret, sent as ``webhook-signature: v1,<base64>`` (several space-separated entries while
a secret rotates). Any Standard Webhooks library verifies these; this module adds several secrets,
a clock you can pass in, and one typed error per way a request can fail.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets as _random
import time
from collections.abc import Iterable, Mapping
from typing import Any

SECRET_PREFIX = "whsec_"
DEFAULT_TOLERANCE_S = 300
# A webhook-id is a delivery id; anything this long or with control characters is not one of ours.
MAX_WEBHOOK_ID_LENGTH = 256

Secret = str | bytes
Secrets = Secret | Iterable[Secret]


class InvalidSecretError(ValueError):
    """A configured secret is not ``whsec_<base64>`` (or raw key bytes): a setup mistake, not a request's."""


class WebhookVerificationError(Exception):
    """The request cannot be trusted as a webhook from Fatura; ``code`` names the reason."""

    code = "verification_failed"


class MissingHeaderError(WebhookVerificationError):
    code = "missing_header"


class MalformedHeaderError(WebhookVerificationError):
    code = "malformed_header"


class BadSignatureError(WebhookVerificationError):
    code = "bad_signature"


class TimestampOutOfWindowError(WebhookVerificationError):
    code = "timestamp_out_of_window"


class StaleTimestampError(TimestampOutOfWindowError):
    code = "stale_timestamp"


class FutureTimestampError(TimestampOutOfWindowError):
    code = "future_timestamp"


class MalformedPayloadError(WebhookVerificationError):
    """The signature is good but the body is not a JSON object: the sender has a bug."""

    code = "malformed_payload"


def decode_secret(secret: Secret) -> bytes:
    """The HMAC key of a secret: base64 after the ``whsec_`` prefix, or raw bytes as given."""
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret.strip()
        text = text.removeprefix(SECRET_PREFIX)
        try:
            # Unpadded base64 is common in the wild; pad it rather than refuse it.
            key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
        except (binascii.Error, ValueError):
            raise InvalidSecretError("a webhook secret must be 'whsec_' followed by base64") from None
    if not key:
        raise InvalidSecretError("a webhook secret must not be empty")
    return key


def decode_secrets(secrets: Secrets) -> tuple[bytes, ...]:
    items: Iterable[Secret] = [secrets] if isinstance(secrets, str | bytes) else secrets
    keys = tuple(decode_secret(s) for s in items)
    if not keys:
        raise InvalidSecretError("at least one webhook secret is needed")
    return keys


def generate_secret(n_bytes: int = 24) -> str:
    return SECRET_PREFIX + base64.b64encode(_random.token_bytes(n_bytes)).decode("ascii")


def signature(secret: Secret, webhook_id: str, timestamp: int, raw_body: bytes) -> str:
    """One ``v1,<base64>`` entry over the exact bytes sent."""
    signed = f"{webhook_id}.{timestamp}.".encode() + raw_body
    digest = hmac.new(decode_secret(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def sign_headers(
    secrets: Secrets, webhook_id: str, raw_body: bytes, *, timestamp: int | None = None
) -> dict[str, str]:
    """The three webhook headers, one signature per secret (the rotation case has two)."""
    ts = int(time.time()) if timestamp is None else timestamp
    items: Iterable[Secret] = [secrets] if isinstance(secrets, str | bytes) else secrets
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(ts),
        "webhook-signature": " ".join(signature(s, webhook_id, ts, raw_body) for s in items),
        "content-type": "application/json",
    }


def verify(
    secrets: Secrets,
    headers: Mapping[str, str],
    raw_body: bytes,
    *,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> dict[str, Any]:
    """Check the headers against the raw body and return the parsed event.

    Raises a ``WebhookVerificationError`` subclass; passes when any signature entry matches any
    secret. The timestamp must lie within ``tolerance_s`` of ``now`` in either direction, which
    with a durable webhook-id inbox is what stops replays.
    """
    verify_signature(secrets, headers, raw_body, tolerance_s=tolerance_s, now=now)
    try:
        event = json.loads(raw_body)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise MalformedPayloadError("the signed body is not JSON") from None
    if not isinstance(event, dict):
        raise MalformedPayloadError("the signed body is not a JSON object")
    return event


def verify_signature(
    secrets: Secrets,
    headers: Mapping[str, str],
    raw_body: bytes,
    *,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> str:
    """Check the headers against the raw body without reading the body; returns the webhook-id.

    For a receiver that parses the body its own way once it knows who sent it (Fatura's
    acknowledgement route does). Raises what ``verify`` raises, except ``MalformedPayloadError``.
    """
    keys = decode_secrets(secrets)
    lowered = {k.lower(): v for k, v in headers.items()}
    webhook_id = _header(lowered, "webhook-id")
    raw_timestamp = _header(lowered, "webhook-timestamp")
    raw_signature = _header(lowered, "webhook-signature")

    if len(webhook_id) > MAX_WEBHOOK_ID_LENGTH or not webhook_id.isprintable():
        raise MalformedHeaderError("webhook-id is too long or holds control characters")
    if not (raw_timestamp.isascii() and raw_timestamp.isdigit()) or len(raw_timestamp) > 12:
        raise MalformedHeaderError("webhook-timestamp must be whole unix seconds")
    timestamp = int(raw_timestamp)
    current = time.time() if now is None else now
    if timestamp < current - tolerance_s:
        raise StaleTimestampError(f"webhook-timestamp is more than {tolerance_s}s in the past")
    if timestamp > current + tolerance_s:
        raise FutureTimestampError(f"webhook-timestamp is more than {tolerance_s}s in the future")

    offered = _v1_signatures(raw_signature)
    signed = f"{webhook_id}.{timestamp}.".encode() + raw_body
    expected = [hmac.new(key, signed, hashlib.sha256).digest() for key in keys]
    # Compare every pair in constant time and without an early exit on the first miss.
    matched = False
    for candidate in offered:
        for want in expected:
            matched |= hmac.compare_digest(candidate, want)
    if not matched:
        raise BadSignatureError("no webhook-signature entry matches a configured secret")
    return webhook_id


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None or not value.strip():
        raise MissingHeaderError(f"the {name} header is missing")
    return value.strip()


def _v1_signatures(raw: str) -> list[bytes]:
    """Decoded ``v1`` entries; other versions are skipped, so a future scheme can be added alongside."""
    found: list[bytes] = []
    for entry in raw.split():
        version, sep, encoded = entry.partition(",")
        if not sep or version != "v1":
            continue
        try:
            found.append(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            continue
    if not found:
        raise MalformedHeaderError("webhook-signature holds no v1,<base64> entry")
    return found
