"""Every httpx error and HTTP status maps to an error class in one place, and only the retryable
ones move a request to the next channel (DESIGN §5.6)."""

from __future__ import annotations

import httpx
import pytest

from services.inference.providers.base import RETRYABLE, ErrorClass
from services.inference.providers.classify import (
    _EXCEPTIONS,
    FAILOVER,
    exception_error_class,
    status_error_class,
)


def _httpx_exceptions() -> list[type[Exception]]:
    found = []
    for name in httpx.__all__:
        value = getattr(httpx, name)
        if isinstance(value, type) and issubclass(value, Exception):
            found.append(value)
    return found


def test_every_exception_httpx_exports_has_its_own_entry() -> None:
    # Like httpx's own test of map_httpcore_exceptions: a new exception class in a future httpx
    # must be classified on purpose, not fall through to a parent's meaning.
    exported = _httpx_exceptions()
    assert len(exported) > 20, "the scan found too few exception classes"
    assert [e.__name__ for e in exported if e not in _EXCEPTIONS] == []


def test_every_subclass_of_httpx_errors_is_covered_through_its_ancestry() -> None:
    seen: list[type[BaseException]] = []
    stack: list[type[BaseException]] = [
        httpx.HTTPError,
        httpx.StreamError,
        httpx.InvalidURL,
        httpx.CookieConflict,
    ]
    while stack:
        cls = stack.pop()
        seen.append(cls)
        stack.extend(cls.__subclasses__())
    for cls in seen:
        assert any(k in _EXCEPTIONS for k in cls.__mro__), cls


@pytest.mark.parametrize(
    ("exc", "expected", "sent"),
    [
        (httpx.ConnectError("refused"), ErrorClass.CONNECTION, False),
        (httpx.ConnectTimeout("slow"), ErrorClass.CONNECTION, False),
        (httpx.PoolTimeout("busy"), ErrorClass.CONNECTION, False),
        (httpx.ReadTimeout("no headers"), ErrorClass.HEADER_TIMEOUT, True),
        (httpx.RemoteProtocolError("closed"), ErrorClass.CONNECTION, True),
        (httpx.ReadError("reset"), ErrorClass.CONNECTION, True),
        (httpx.LocalProtocolError("bad header"), ErrorClass.BAD_REQUEST, False),
        (httpx.DecodingError("gzip"), ErrorClass.BAD_RESPONSE, True),
    ],
)
def test_transport_errors_before_the_headers(exc: Exception, expected: ErrorClass, sent: bool) -> None:
    assert exception_error_class(exc, headers_received=False) == (expected, sent)


def test_a_read_timeout_after_the_headers_is_a_stalled_stream_not_a_header_timeout() -> None:
    assert exception_error_class(httpx.ReadTimeout("stall"), headers_received=True) == (
        ErrorClass.CONNECTION,
        True,
    )


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, None),
        (429, ErrorClass.RATE_LIMITED),
        (500, ErrorClass.SERVER_ERROR),
        (503, ErrorClass.SERVER_ERROR),
        (529, ErrorClass.SERVER_ERROR),
        (400, ErrorClass.BAD_REQUEST),
        (422, ErrorClass.BAD_REQUEST),
        (401, ErrorClass.UNAUTHORIZED),
        (403, ErrorClass.UNAUTHORIZED),
        (402, ErrorClass.PAYMENT_REQUIRED),
        (404, ErrorClass.NOT_FOUND),
        (302, ErrorClass.BAD_RESPONSE),
    ],
)
def test_statuses_map_to_error_classes(status: int, expected: ErrorClass | None) -> None:
    assert status_error_class(status) == expected


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 422])
def test_client_errors_never_fail_over(status: int) -> None:
    assert status_error_class(status) not in FAILOVER


def test_failover_classes_are_all_retryable_by_the_schedule() -> None:
    assert FAILOVER <= RETRYABLE
