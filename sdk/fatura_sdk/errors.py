"""The client's errors: one type per kind of answer, mapped from a response in one place.

Every error the API answers has the body ``{"error": {"code", "message", ...}}``; ``ApiError``
keeps the status, the stable ``code``, the message and the details. A client mistake (4xx) is
raised as it is; 429 and 503 say when to try again (``retry_after``) and wrote nothing. When no
answer came at all, ``TransportError`` says whether the request may have reached the server.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from typing import Any


class FaturaError(Exception):
    """Everything this client raises."""


class TransportError(FaturaError):
    """No answer came: the server could not be reached, or the connection broke or timed out.

    ``sent`` is False when the request certainly never reached the server (the connection was not
    made), so repeating it cannot do anything twice.
    """

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class ApiError(FaturaError):
    """An error answer of the API."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details or {})
        self.retry_after = retry_after


class BadRequest(ApiError):
    """400: malformed JSON, a bad header or query parameter."""


class Unauthorized(ApiError):
    """401: no key, or a malformed, unknown or revoked one."""


class Forbidden(ApiError):
    """403: a valid key of another scope (``wrong_key_scope``)."""


class NotFound(ApiError):
    """404: no such job, document or batch for this tenant."""


class Conflict(ApiError):
    """409: an Idempotency-Key reused for another request (``idempotency_key_reused``, the existing
    job in ``details["job_id"]``), or the job has already finished (``job_already_finished``)."""

    @property
    def job_id(self) -> str | None:
        job_id = self.details.get("job_id")
        return job_id if isinstance(job_id, str) else None


class PayloadTooLarge(ApiError):
    """413: the body or the document is over the server's cap."""


class UnsupportedMediaType(ApiError):
    """415: not ``application/json``."""


class ValidationError(ApiError):
    """422: the body breaks the schema; ``details["errors"]`` names each problem's JSON path."""


class RateLimited(ApiError):
    """429: a tenant limit (quota, daily budget, too many failed keys); nothing was written."""


class ServiceUnavailable(ApiError):
    """503: the system cannot take the request now (backlog full, a dependency down); nothing was
    written."""


class ServerError(ApiError):
    """Any other 5xx: the server failed; the request may or may not have had an effect."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationError,
    429: RateLimited,
    503: ServiceUnavailable,
}

# A 409 that means "a twin of this request is still being written": the same request again is safe.
IN_FLIGHT = "idempotency_key_in_flight"


def retry_after_seconds(value: str | None, *, now: float | None = None) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date; None when absent or bad."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if text.isdigit():
        return float(int(text))
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def error_from_answer(status: int, body: Any, headers: Mapping[str, str]) -> ApiError:
    """The typed error of an answer that is not 2xx."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code")
    message = error.get("message")
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    lowered = {name.lower(): value for name, value in headers.items()}
    retry_after = retry_after_seconds(lowered.get("retry-after"))
    if retry_after is None and isinstance(details.get("retry_after_seconds"), int | float):
        retry_after = float(details["retry_after_seconds"])
    kind = _BY_STATUS.get(status) or (ServerError if status >= 500 else ApiError)
    return kind(
        status,
        code if isinstance(code, str) else f"http_{status}",
        message if isinstance(message, str) else f"the server answered {status}",
        details=details,
        retry_after=retry_after,
    )


def is_transient(error: FaturaError) -> bool:
    """Whether the same request later may succeed where this one did not."""
    if isinstance(error, TransportError):
        return True
    if isinstance(error, RateLimited | ServiceUnavailable | ServerError):
        return True
    return isinstance(error, Conflict) and error.code == IN_FLIGHT


class UnexpectedAnswer(FaturaError):
    """A 2xx whose body is not what the API promises (a proxy's page, a truncated body)."""
