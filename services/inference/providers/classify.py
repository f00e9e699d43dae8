"""What a provider's answer or an httpx error means for the attempt: the one place that knows them.

Pure functions: an HTTP status or an httpx exception becomes an ``ErrorClass`` (and whether the
request may have left this process), and ``Retry-After`` in seconds or as an HTTP-date becomes
milliseconds. The gateway decides failover, breaker counting and the limiter refund from these.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from services.inference.providers.base import ErrorClass

# Only these move a request to the next channel and count against a channel's breaker (DESIGN
# §5.6). A 400 or a 402 is the same answer from every channel; a deadline is our own budget.
FAILOVER = frozenset(
    {
        ErrorClass.RATE_LIMITED,
        ErrorClass.SERVER_ERROR,
        ErrorClass.CONNECTION,
        ErrorClass.HEADER_TIMEOUT,
        ErrorClass.STREAM_ERROR,
    }
)

MAX_RETRY_AFTER_MS = 86_400_000  # a day: anything longer is a broken header, not advice


def status_error_class(status: int) -> ErrorClass | None:
    """None for a 2xx: the body decides."""
    if 200 <= status < 300:
        return None
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status >= 500 or status in (408, 409):
        # 408/409 are the provider's transient conditions (timeout, lock contention), not ours.
        return ErrorClass.SERVER_ERROR
    if status == 401 or status == 403:
        return ErrorClass.UNAUTHORIZED
    if status == 402:
        return ErrorClass.PAYMENT_REQUIRED
    if status == 404:
        return ErrorClass.NOT_FOUND
    if 400 <= status < 500:
        return ErrorClass.BAD_REQUEST
    return ErrorClass.BAD_RESPONSE  # 1xx/3xx: redirects are never followed


# exception type -> (class, whether the request may have reached the provider). Looked up along the
# exception's MRO, so the most specific entry wins; tests/unit/test_gateway_classify.py checks that
# every exception httpx exports has an entry of its own.
_EXCEPTIONS: Mapping[type[Exception], tuple[ErrorClass, bool]] = {
    httpx.ConnectTimeout: (ErrorClass.CONNECTION, False),
    httpx.ConnectError: (ErrorClass.CONNECTION, False),
    httpx.PoolTimeout: (ErrorClass.CONNECTION, False),
    httpx.ProxyError: (ErrorClass.CONNECTION, False),
    httpx.UnsupportedProtocol: (ErrorClass.CONNECTION, False),
    httpx.ReadTimeout: (ErrorClass.HEADER_TIMEOUT, True),
    httpx.WriteTimeout: (ErrorClass.CONNECTION, True),
    httpx.TimeoutException: (ErrorClass.CONNECTION, True),
    httpx.ReadError: (ErrorClass.CONNECTION, True),
    httpx.WriteError: (ErrorClass.CONNECTION, True),
    httpx.CloseError: (ErrorClass.CONNECTION, True),
    httpx.NetworkError: (ErrorClass.CONNECTION, True),
    httpx.RemoteProtocolError: (ErrorClass.CONNECTION, True),
    httpx.LocalProtocolError: (ErrorClass.BAD_REQUEST, False),  # we built a request h11 refuses
    httpx.ProtocolError: (ErrorClass.CONNECTION, True),
    httpx.TransportError: (ErrorClass.CONNECTION, True),
    httpx.DecodingError: (ErrorClass.BAD_RESPONSE, True),
    httpx.TooManyRedirects: (ErrorClass.BAD_RESPONSE, True),
    httpx.RequestError: (ErrorClass.CONNECTION, True),
    httpx.HTTPStatusError: (ErrorClass.SERVER_ERROR, True),  # never raised: statuses are read, not raised
    httpx.HTTPError: (ErrorClass.CONNECTION, True),
    httpx.InvalidURL: (ErrorClass.BAD_REQUEST, False),
    httpx.CookieConflict: (ErrorClass.BAD_RESPONSE, True),
    # Misuse of a response object: a bug here, reported as an unusable answer rather than raised.
    httpx.StreamConsumed: (ErrorClass.BAD_RESPONSE, True),
    httpx.StreamClosed: (ErrorClass.BAD_RESPONSE, True),
    httpx.ResponseNotRead: (ErrorClass.BAD_RESPONSE, True),
    httpx.RequestNotRead: (ErrorClass.BAD_RESPONSE, True),
    httpx.StreamError: (ErrorClass.BAD_RESPONSE, True),
}


def exception_error_class(exc: BaseException, *, headers_received: bool) -> tuple[ErrorClass, bool]:
    """The class of an httpx error and whether the request may have been sent.

    A read timeout before the headers is the header timeout; after them the body stalled, which
    ends the attempt like a dropped connection.
    """
    for kind in type(exc).__mro__:
        entry = _EXCEPTIONS.get(kind)
        if entry is not None:
            error_class, sent = entry
            if error_class is ErrorClass.HEADER_TIMEOUT and headers_received:
                return ErrorClass.CONNECTION, True
            return error_class, sent or headers_received
    return ErrorClass.CONNECTION, True


def retry_after_ms(headers: Mapping[str, str], now: datetime | None = None) -> int | None:
    """``retry-after-ms`` (OpenAI's) or ``Retry-After`` as delay-seconds or an HTTP-date, in ms.

    None when absent or unreadable; a date in the past is 0; clamped to a day.
    """
    raw_ms = headers.get("retry-after-ms")
    if raw_ms is not None:
        value = _number(raw_ms)
        if value is not None:
            return _clamp(value)
    raw = headers.get("retry-after")
    return None if raw is None else parse_retry_after(raw, now)


def parse_retry_after(value: str, now: datetime | None = None) -> int | None:
    value = value.strip()
    seconds = _number(value)
    if seconds is not None:
        return _clamp(seconds * 1000)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # asctime dates carry no zone; HTTP dates are always GMT
        when = when.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    return _clamp((when - now).total_seconds() * 1000)


def _number(value: str) -> float | None:
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number) or number < 0:
        return None
    return number


def _clamp(ms: float) -> int:
    return int(min(max(math.ceil(ms), 0), MAX_RETRY_AFTER_MS))
