"""The HTTP API's errors, for every service's routes: each carries its HTTP status, a stable code
and words for a person.

Every client mistake becomes one of these (never a 500), and the body is always
``{"error": {"code": ..., "message": ..., ...details}}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ApiError(Exception):
    status: int = 400
    code: str = "bad_request"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        headers: Mapping[str, str] | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        self.headers = dict(headers or {})
        self.details = dict(details or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.details}}


class Unauthorized(ApiError):
    status = 401
    code = "unauthorized"


class Forbidden(Unauthorized):
    """A valid key of another scope. An ``Unauthorized`` too, so a caller that refuses a bad key (the
    CLI's ``endpoints add``) refuses this one with its message; the edge answers its own status."""

    status = 403
    code = "wrong_key_scope"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ApiError):
    status = 415
    code = "unsupported_media_type"


class Unprocessable(ApiError):
    status = 422
    code = "invalid_request"


class Unavailable(ApiError):
    status = 503
    code = "unavailable"
