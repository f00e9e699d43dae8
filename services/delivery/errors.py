"""The delivery service's errors: a bad endpoint definition, a refused target, an unknown record, an
acknowledgement that does not verify or does not fit the delivery."""

from __future__ import annotations


class DeliveryError(Exception):
    """Base of every error the delivery service raises on purpose."""

    code = "delivery_error"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


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


class Unauthenticated(DeliveryError):
    """A signed request whose signature does not verify with a secret of the endpoint it names."""

    code = "bad_signature"


class InvalidRequest(DeliveryError):
    """A request body that is well-formed JSON but means nothing here (422)."""

    code = "invalid_request"


class SecretUnavailable(DeliveryError):
    """The endpoint's secrets do not open in this process (its master key is missing): not the
    caller's fault; it may ask again once the key is back."""

    code = "secret_unreadable"


class BadQuery(DeliveryError):
    """A query parameter the route cannot use (400)."""

    code = "invalid_query"
