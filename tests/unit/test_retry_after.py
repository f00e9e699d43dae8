"""Retry-After in seconds or as an HTTP-date becomes milliseconds (seed 000 §4, DESIGN §5.6)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from services.inference.providers.classify import MAX_RETRY_AFTER_MS, parse_retry_after, retry_after_ms

NOW = datetime(2026, 11, 30, 8, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("0", 0),
        ("7", 7_000),
        (" 120 ", 120_000),
        ("1.5", 1_500),  # not RFC 9110, but providers send it; round up, never shorten a wait
        ("0.0004", 1),
    ],
)
def test_delay_seconds_become_milliseconds(value: str, expected: int) -> None:
    assert parse_retry_after(value, NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "Mon, 30 Nov 2026 08:00:30 GMT",  # IMF-fixdate
        "Monday, 30-Nov-26 08:00:30 GMT",  # obsolete RFC 850
        "Mon Nov 30 08:00:30 2026",  # asctime, which carries no zone: GMT
    ],
)
def test_an_http_date_becomes_the_wait_until_it(value: str) -> None:
    assert parse_retry_after(value, NOW) == 30_000


def test_a_date_in_the_past_means_retry_now() -> None:
    assert parse_retry_after("Mon, 30 Nov 2026 07:59:00 GMT", NOW) == 0


@pytest.mark.parametrize("value", ["", "soon", "-5", "nan", "inf", "Mon, 99 Foo 2026"])
def test_an_unreadable_value_is_ignored(value: str) -> None:
    assert parse_retry_after(value, NOW) is None


def test_an_absurd_wait_is_clamped_to_a_day() -> None:
    assert parse_retry_after("99999999999", NOW) == MAX_RETRY_AFTER_MS


def test_openai_retry_after_ms_header_wins_over_retry_after() -> None:
    assert retry_after_ms({"retry-after-ms": "250", "retry-after": "3"}, NOW) == 250
    assert retry_after_ms({"retry-after-ms": "junk", "retry-after": "3"}, NOW) == 3_000
    assert retry_after_ms({}, NOW) is None
