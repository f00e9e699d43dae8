"""fatura-sdk: what a partner installs to receive Fatura's signed webhooks.

``verify`` checks a request; ``Receiver`` adds the durable inbox that turns at-least-once delivery
into exactly one effect.
"""

from fatura_sdk.receiver import Apply, Event, InvalidEvent, Receiver, Response, payload_digest
from fatura_sdk.webhooks import (
    BadSignatureError,
    FutureTimestampError,
    InvalidSecretError,
    MalformedHeaderError,
    MalformedPayloadError,
    MissingHeaderError,
    StaleTimestampError,
    TimestampOutOfWindowError,
    WebhookVerificationError,
    generate_secret,
    sign_headers,
    signature,
    verify,
)

__all__ = [
    "Apply",
    "BadSignatureError",
    "Event",
    "FutureTimestampError",
    "InvalidEvent",
    "InvalidSecretError",
    "MalformedHeaderError",
    "MalformedPayloadError",
    "MissingHeaderError",
    "Receiver",
    "Response",
    "StaleTimestampError",
    "TimestampOutOfWindowError",
    "WebhookVerificationError",
    "generate_secret",
    "payload_digest",
    "sign_headers",
    "signature",
    "verify",
]
