"""Batches as pure rules: keys, the parsed request, admission of the whole, what each state says in
words, the batch event as a message and as a webhook body."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from services.acceptance import admission
from services.acceptance.batches import BatchParser, CreateBatch, item_key
from services.acceptance.batches.requests import item_keys
from services.acceptance.batches.service import decode_cursor, encode_cursor
from services.acceptance.batches.views import accepted_body, counts, item_body, status_body
from services.acceptance.settings import AcceptanceSettings
from services.common import events
from services.common.api.errors import ApiError
from services.common.api.tenancy import TenantLimits
from services.common.messages import BadMessage, parse_event
from services.delivery import payload

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
SETTINGS = AcceptanceSettings()


def _batch(state: str = "running", **counters: int) -> dict[str, Any]:
    base = {"succeeded": 0, "review_required": 0, "failed": 0, "rejected": 0, "cancelled": 0}
    return {
        "id": uuid.UUID(int=5),
        "tenant_id": uuid.UUID(int=6),
        "state": state,
        "total": 10,
        "accepted": 10,
        "priority": "batch",
        "created_at": NOW - timedelta(seconds=90),
        "completed_at": NOW if state.startswith("completed") else None,
        "now": NOW,
        **base,
        **counters,
    }


def test_an_items_key_is_the_batch_key_a_space_and_its_index_unless_it_has_its_own() -> None:
    parsed = BatchParser(SETTINGS).create_batch(
        {"items": [{"document": {"text": "a"}}, {"document": {"text": "b"}, "idempotency_key": "mine"}]}
    )
    assert item_keys("run-7", parsed) == ["run-7 #0", "mine"]
    assert item_key("run-7", 12) == "run-7 #12"


def test_two_items_with_one_key_are_refused_naming_both() -> None:
    parsed = BatchParser(SETTINGS).create_batch(
        {
            "items": [
                {"document": {"text": "a"}, "idempotency_key": "k"},
                {"document": {"text": "b"}, "idempotency_key": "k"},
            ]
        }
    )
    with pytest.raises(ApiError) as refused:
        item_keys("run", parsed)
    assert (refused.value.code, refused.value.details["indexes"]) == ("duplicate_item_key", [0, 1])


def test_the_batch_gives_its_settings_to_every_item_and_an_item_may_bring_its_own_options() -> None:
    parsed: CreateBatch = BatchParser(SETTINGS).create_batch(
        {
            "items": [
                {"document": {"text": "a"}},
                {"document_id": str(uuid.UUID(int=1)), "document_version": 2, "options": {"language": "de"}},
            ],
            "priority": "interactive",
            "deadline_seconds": 600,
            "options": {"language": "tr"},
        }
    )
    first, second = (item.job for item in parsed.items)
    assert parsed.priority == first.priority == second.priority == "interactive"
    assert first.deadline_seconds == second.deadline_seconds == 600
    assert (first.options, second.options) == ({"language": "tr"}, {"language": "de"})


def test_an_oversized_document_is_413_naming_its_item() -> None:
    small = AcceptanceSettings(max_document_bytes=1024)
    with pytest.raises(ApiError) as refused:
        BatchParser(small).create_batch(
            {"items": [{"document": {"text": "a"}}, {"document": {"text": "x" * 2000}}]}
        )
    assert (refused.value.status, refused.value.code, refused.value.details["index"]) == (
        413,
        "document_too_large",
        1,
    )


def test_admission_counts_every_item_of_a_batch_against_the_pending_cap() -> None:
    limits = TenantLimits(
        max_pending_jobs=10, max_pending_bytes=10**9, max_pending_tokens=10**9, daily_token_budget=10**9
    )
    usage = admission.Usage(
        pending_jobs=4, pending_bytes=0, pending_tokens=0, tokens_today=0, system_pending_jobs=4
    )
    cost = admission.JobCost(bytes=700, tokens=7000)

    def decide(jobs: int) -> admission.Rejection | None:
        return admission.decide(
            limits,
            usage,
            cost,
            max_system_backlog=1000,
            now=NOW,
            quota_retry_after=30,
            backlog_retry_after=60,
            jobs=jobs,
        )

    assert decide(6) is None
    refused = decide(7)
    assert refused is not None and (refused.limit, refused.current, refused.maximum) == (
        "pending_jobs",
        4,
        10,
    )
    assert "4 + 7 > 10" in refused.message


def test_processed_counts_final_items_and_a_review_is_neither_processed_nor_pending() -> None:
    assert counts(_batch(succeeded=5, review_required=2, failed=1, cancelled=1)) == {
        "total": 10,
        "processed": 7,
        "pending": 1,
        "succeeded": 5,
        "review_required": 2,
        "failed": 1,
        "rejected": 0,
        "cancelled": 1,
    }


def test_a_running_batch_is_not_done_says_so_and_points_to_the_finished_results() -> None:
    body = status_body(_batch(succeeded=3, review_required=1), SETTINGS.expected_jobs_per_second)
    assert (body["done"], body["state"]) == (False, "running")
    assert "NOT complete" in body["message"] and "Do not report success" in body["message"]
    assert "?state=SUCCEEDED" in body["message"] and "1 wait for a human reviewer" in body["message"]
    assert body["poll_after_seconds"] >= 10 and "errors_url" not in body


def test_a_batch_whose_unfinished_items_all_wait_for_review_is_still_running_and_polls_slowly() -> None:
    body = status_body(_batch(succeeded=8, review_required=2), SETTINGS.expected_jobs_per_second)
    assert (body["done"], body["poll_after_seconds"]) == (False, 60)
    assert "did NOT pass validation" in body["message"] and "must not be used" in body["message"]


def test_a_batch_whose_items_are_final_but_not_yet_closed_says_to_look_again_in_seconds() -> None:
    body = status_body(_batch(succeeded=10), SETTINGS.expected_jobs_per_second)
    assert (body["done"], body["poll_after_seconds"]) == (False, 2)
    assert "being closed" in body["message"]


def test_finished_batches_are_done_and_only_a_clean_one_is_reported_complete() -> None:
    clean = status_body(_batch("completed", succeeded=10), SETTINGS.expected_jobs_per_second)
    assert clean["done"] is True and clean["message"].startswith("Complete: all 10 items")
    assert "poll_after_seconds" not in clean
    errors = status_body(
        _batch("completed_with_errors", succeeded=7, failed=2, rejected=1), SETTINGS.expected_jobs_per_second
    )
    assert errors["done"] is True and "WITH ERRORS" in errors["message"]
    assert "Do not report the batch as fully successful" in errors["message"]
    assert errors["errors_url"] == f"/v1/extraction-batches/{uuid.UUID(int=5)}/items?state=errors"
    assert errors["errors_url"] in errors["message"]


def test_an_interrupted_batch_says_to_send_the_same_request_again() -> None:
    body = status_body({**_batch("accepting"), "accepted": 4}, SETTINGS.expected_jobs_per_second)
    assert body["done"] is False and "only 4 of 10 items were accepted" in body["message"]
    assert "same Idempotency-Key" in body["message"] and "poll_after_seconds" not in body


def test_the_accepted_body_says_started_and_nothing_complete() -> None:
    body = accepted_body(_batch(), estimated_seconds=80, replay=False, expected_jobs_per_second=1.5)
    assert body["done"] is False and body["counts"]["pending"] == 10
    assert "has STARTED" in body["message"] and "NONE is complete" in body["message"]
    replay = accepted_body(_batch(), estimated_seconds=80, replay=True, expected_jobs_per_second=1.5)
    assert replay["message"].startswith("This request repeats an earlier one")


def test_an_items_result_is_shown_only_once_it_succeeded() -> None:
    job = {
        "id": uuid.UUID(int=9),
        "batch_index": 3,
        "idempotency_key": "k #3",
        "state_version": 3,
        "result": {"total": "1.00"},
        "decided_by": None,
        "review_reasons": [{"code": "arithmetic_total"}],
        "error_class": None,
        "error_message": None,
    }
    assert item_body({**job, "state": "SUCCEEDED"})["result"] == {"total": "1.00"}
    review = item_body({**job, "state": "REVIEW_REQUIRED"})
    assert "result" not in review and review["done"] is False and review["review"]["reasons"]
    cancelled = item_body({**job, "state": "CANCELLED"})
    assert cancelled["error"] == {
        "class": "cancelled",
        "message": "The job was cancelled; no result will be produced.",
    }
    assert cancelled["done"] is True


def test_an_items_cursor_round_trips_and_any_other_text_is_400() -> None:
    assert decode_cursor(encode_cursor(4711)) == 4711
    for bad in ("", "nonsense", encode_cursor(1)[:-1] + "!", "aTrCsg", "aTot"):
        with pytest.raises(ApiError):
            decode_cursor(bad)


def test_a_batch_event_names_its_batch_and_a_job_event_still_needs_its_job() -> None:
    batch_id, tenant_id = uuid.uuid4(), uuid.uuid4()
    event = {
        "event_id": str(uuid.uuid4()),
        "event_type": events.BATCH_COMPLETED,
        "tenant_id": str(tenant_id),
        "batch_id": str(batch_id),
        "state": "completed",
        "state_version": 1,
    }
    parsed = parse_event(event, payload.EVENT_TYPES)
    assert (parsed.job_id, parsed.batch_id, parsed.subject_id) == (None, batch_id, batch_id)
    with pytest.raises(BadMessage, match="batch_id"):
        parse_event({k: v for k, v in event.items() if k != "batch_id"}, payload.EVENT_TYPES)
    with pytest.raises(BadMessage, match="job_id"):
        parse_event({**event, "event_type": events.EXTRACTION_COMPLETED}, payload.EVENT_TYPES)
    assert events.ROUTES[events.BATCH_COMPLETED] == (events.DELIVERY_INGEST,)


def test_the_batch_webhook_carries_ids_counts_and_links_never_a_result() -> None:
    event_id = uuid.uuid4()
    raw = payload.batch_body(
        event_id=event_id,
        event_type=events.BATCH_COMPLETED,
        state="completed_with_errors",
        occurred_at=NOW,
        batch=_batch("completed_with_errors", succeeded=8, failed=1, cancelled=1),
    )
    body = json.loads(raw)
    assert (body["type"], body["id"], body["timestamp"]) == (
        events.BATCH_COMPLETED,
        str(event_id),
        "2026-11-30T12:00:00Z",
    )
    assert body["data"]["counts"] == {
        "total": 10,
        "processed": 10,
        "succeeded": 8,
        "failed": 1,
        "rejected": 0,
        "cancelled": 1,
    }
    batch_url = f"/v1/extraction-batches/{uuid.UUID(int=5)}"
    assert body["data"]["status_url"] == batch_url
    assert body["data"]["errors_url"] == f"{batch_url}/items?state=errors"
    assert "result" not in raw.decode()
