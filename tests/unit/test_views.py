"""What clients and agents read: every body says whether the job is done, in words and as a boolean."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.acceptance.views import accepted_body, poll_after, status_body, summary_body
from services.common import states

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _job(state: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": uuid.UUID(int=7),
        "state": state,
        "state_version": 3,
        "attempt": 1,
        "priority": "interactive",
        "document_id": uuid.UUID(int=9),
        "document_version": 1,
        "schema_version": "invoice.v1",
        "created_at": NOW - timedelta(seconds=30),
        "updated_at": NOW,
        "finished_at": NOW - timedelta(seconds=5) if state in states.TERMINAL else None,
        "deadline_at": NOW + timedelta(days=1),
        "available_at": NOW,
        "error_class": None,
        "error_message": None,
        "review_reasons": None,
        "now": NOW,
        **extra,
    }


def test_the_accepted_body_says_started_not_complete_and_when_to_poll() -> None:
    body = accepted_body(_job(states.READY), estimated_seconds=40, replay=False)
    assert body["done"] is False
    assert body["poll_after_seconds"] == 10
    assert "has STARTED and is NOT complete" in body["message"]
    assert "Do not report success" in body["message"]
    assert body["status_url"] in body["message"]


def test_a_replayed_acceptance_says_it_repeats_an_earlier_request() -> None:
    body = accepted_body(_job(states.RUNNING), estimated_seconds=40, replay=True)
    assert body["message"].startswith("This request repeats an earlier one")
    assert body["done"] is False


@pytest.mark.parametrize("state", sorted(states.NON_TERMINAL))
def test_unfinished_states_are_not_done_and_say_when_to_poll(state: str) -> None:
    body = status_body(_job(state))
    assert body["done"] is False
    assert body["poll_after_seconds"] >= 1
    assert "NOT complete" in body["message"]
    assert body["elapsed_seconds"] == 30.0


def test_a_job_awaiting_review_is_not_done_and_says_a_reviewer_decides() -> None:
    body = status_body(_job(states.REVIEW_REQUIRED, review_reasons=[{"code": "x"}]))
    assert body["done"] is False
    assert body["poll_after_seconds"] == 60
    assert "NOT complete" in body["message"] and "reviewer" in body["message"]
    assert body["elapsed_seconds"] == 25.0


@pytest.mark.parametrize("state", sorted(states.FINAL))
def test_finished_states_are_done_and_stop_the_clock(state: str) -> None:
    body = status_body(_job(state, error_class="provider_rejected", review_reasons=[{"code": "x"}]))
    assert body["done"] is True
    assert "poll_after_seconds" not in body
    assert body["elapsed_seconds"] == 25.0
    assert "NOT complete" not in body["message"]


def test_review_and_failure_carry_their_reasons() -> None:
    review = status_body(_job(states.REVIEW_REQUIRED, review_reasons=[{"code": "iban_checksum"}]))
    failed = status_body(
        _job(states.FAILED_TERMINAL, error_class="deadline_exceeded", error_message="too late")
    )
    assert review["review"] == {"reasons": [{"code": "iban_checksum"}]}
    assert "human reviewer" in review["message"]
    assert failed["error"] == {
        "class": "deadline_exceeded",
        "message": "The job's deadline passed before an extraction could finish.",
    }


def test_a_scheduled_retry_is_polled_when_it_is_due() -> None:
    body = status_body(_job(states.RETRY_SCHEDULED, available_at=NOW + timedelta(seconds=12.2)))
    assert body["poll_after_seconds"] == 13


def test_poll_interval_stays_within_bounds_per_priority() -> None:
    assert poll_after("interactive", 0) == 2
    assert poll_after("interactive", 10_000) == 30
    assert poll_after("batch", 0) == 10
    assert poll_after("batch", 10_000) == 300


def test_summary_items_carry_done() -> None:
    assert summary_body(_job(states.CANCELLED))["done"] is True
