"""The delivery service's errors: a bad endpoint definition, a refused target, an unknown record."""

from __future__ import annotations


class DeliveryError(Exception):
    """Base of every error the delivery service raises on purpose."""

    code = "delivery_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidEndpoint(DeliveryError):
    """The endpoint definition is malformed: URL, scheme, credentials, event types, options."""

    code = "invalid_endpoint"


class EgressRefused(DeliveryError):
    """The target resolves to an address the egress guard does not let the sender reach."""

    code = "egress_refused"


class NotFound(DeliveryError):
    code = "not_found"


class Conflict(DeliveryError):
    code = "conflict"
