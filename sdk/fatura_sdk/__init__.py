"""fatura-sdk: what a partner installs to receive Fatura's signed webhooks.

``verify`` checks a request; ``Receiver`` adds the durable inbox that turns at-least-once delivery
into exactly one effect; ``acknowledge`` (or ``ack_request``) tells Fatura the business outcome of
a delivery, signed with the same secret.
"""

from fatura_sdk.acks import AckRequest, AckResponse, AckUnreachable, ack_request, acknowledge
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
    verify_signature,
)

__all__ = [
    "AckRequest",
    "AckResponse",
    "AckUnreachable",
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
    "ack_request",
    "acknowledge",
    "generate_secret",
    "payload_digest",
    "sign_headers",
    "signature",
    "verify",
    "verify_signature",
]
