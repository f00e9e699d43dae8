"""The JobService's translations, without a server: HTTP bodies into messages field for field, requests
into the HTTP body the same parser checks, and every typed error into one gRPC status with details."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import psycopg
import pytest
from google.protobuf import json_format
from google.rpc import code_pb2, error_details_pb2, status_pb2
from psycopg_pool import PoolTimeout

from services.acceptance import schemas, views
from services.acceptance.batches import BatchParser
from services.acceptance.batches import schemas as batch_schemas
from services.acceptance.batches import views as batch_views
from services.acceptance.jobs_grpc import messages, status, watch
from services.acceptance.jobs_grpc.servicer import as_api_error
from services.acceptance.requests import DocumentBody, RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.common.api import errors
from services.common.api.errors import ApiError, Conflict, Unprocessable
from services.common.protos.fatura.jobs.v1 import jobs_pb2 as pb

NOW = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _row(state: str) -> dict[str, Any]:
    """A job row as get_job reads it, with every optional column filled."""
    return {
        "id": uuid.UUID(int=7),
        "state": state,
        "state_version": 3,
        "attempt": 2,
        "priority": "batch",
        "document_id": uuid.UUID(int=9),
        "document_version": 1,
        "schema_version": "invoice.v1",
        "policy_version": "invoice-policy.v2",
        "created_at": NOW - timedelta(seconds=30),
        "updated_at": NOW,
        "finished_at": NOW - timedelta(seconds=5) if state in states.TERMINAL else None,
        "deadline_at": NOW + timedelta(days=1),
        "available_at": NOW + timedelta(seconds=20),
        "error_class": "provider_timeout",
        "error_message": "the provider did not answer",
        "review_reasons": [{"rule": "totals_match", "message": "lines do not add up"}],
        "review_id": uuid.UUID(int=11),
        "result": {"invoice_number": "AK-1", "total": "5400.00", "lines": [{"qty": 10}]},
        "decided_by": "reviewer",
        "correction": {"pointer": "/total", "value": "5400.00"},
        "erp": {
            "delivery_id": str(uuid.UUID(int=12)),
            "received_at": None,
            "outcome": "rejected",
            "reason": "unknown supplier",
            "at": NOW.isoformat(),
            "review_id": str(uuid.UUID(int=13)),
        },
        "now": NOW,
    }


def _strict(body: dict[str, Any], message: Any) -> Any:
    return json_format.ParseDict(body, message, ignore_unknown_fields=False)


@pytest.mark.parametrize("state", sorted(states.ALL))
def test_every_field_of_the_http_status_body_has_its_place_in_job_status(state: str) -> None:
    body = views.status_body(_row(state))

    message = messages.job_status(body)

    # Nothing the HTTP body says is dropped on the way (a strict parse would fail on a new field).
    converted = {**body, "state": f"JOB_STATE_{state}", "priority": "PRIORITY_BATCH"}
    for key in ("error", "last_error"):
        if key in converted:
            converted[key] = {"error_class": converted[key]["class"], "message": converted[key]["message"]}
    assert message == _strict(converted, pb.JobStatus())
    assert message.message == body["message"] and message.done is body["done"]
    assert message.HasField("poll_after_seconds") is ("poll_after_seconds" in body)
    if "result" in body:
        assert json_format.MessageToDict(message.result) == body["result"]
    if "error" in body:
        assert message.error.error_class == body["error"]["class"]


def test_the_published_status_schema_and_the_message_name_the_same_fields() -> None:
    fields = set(pb.JobStatus.DESCRIPTOR.fields_by_name)
    assert set(schemas.JOB_STATUS["properties"]) <= fields
    assert set(schemas.JOB_ACCEPTED["properties"]) <= set(pb.SubmitResponse.DESCRIPTOR.fields_by_name)
    assert set(schemas.JOB_SUMMARY["properties"]) <= set(pb.JobSummary.DESCRIPTOR.fields_by_name)


def test_accepted_and_summary_bodies_convert_without_loss() -> None:
    accepted = views.accepted_body(_row(states.READY), estimated_seconds=40, replay=True)
    summary = views.summary_body(_row(states.RUNNING))

    response = messages.submit_response(accepted, replayed=True)
    page = messages.job_list({"jobs": [summary], "next_cursor": None})

    assert response == _strict(
        {**accepted, "state": "JOB_STATE_READY", "replayed": True}, pb.SubmitResponse()
    )
    assert response.replayed and response.message == accepted["message"]
    assert (
        response.state == pb.JOB_STATE_READY and response.poll_after_seconds == accepted["poll_after_seconds"]
    )
    assert page.jobs[0].state == pb.JOB_STATE_RUNNING and page.next_cursor == ""
    assert page.jobs[0].updated_at.ToDatetime(tzinfo=UTC) == NOW


def test_every_wire_state_is_a_job_state_and_back() -> None:
    names = {pb.JobState.Name(v).removeprefix("JOB_STATE_") for v in pb.JobState.values() if v}
    assert names == set(states.ALL)
    assert messages.state_name(pb.JOB_STATE_UNSPECIFIED) is None
    assert messages.state_name(pb.JOB_STATE_REVIEW_REQUIRED) == states.REVIEW_REQUIRED


def test_a_submit_request_becomes_the_http_body_the_same_parser_accepts() -> None:
    request = pb.SubmitRequest(
        idempotency_key="k",
        document=pb.InlineDocument(text="FATURA", filename="a.txt"),
        schema="invoice.v1",
        priority=pb.PRIORITY_INTERACTIVE,
        deadline_seconds=600,
        options=pb.Options(language="tr"),
    )

    body = messages.submit_body(request)
    job = RequestParser(AcceptanceSettings()).create_job(body)

    assert body == {
        "document": {"text": "FATURA", "filename": "a.txt"},
        "schema": "invoice.v1",
        "priority": "interactive",
        "deadline_seconds": 600,
        "options": {"language": "tr"},
    }
    assert isinstance(job.document, DocumentBody) and job.priority == "interactive"
    # Empty strings and zeros are fields not given: the server's defaults apply.
    assert messages.submit_body(pb.SubmitRequest(document=pb.InlineDocument(text="x"))) == {
        "document": {"text": "x"}
    }
    assert messages.submit_body(pb.SubmitRequest(document_id="d", document_version=2)) == {
        "document_id": "d",
        "document_version": 2,
    }


def test_every_status_an_api_error_can_carry_has_a_grpc_code() -> None:
    def subclasses(cls: type[ApiError]) -> list[type[ApiError]]:
        return [cls, *(s for sub in cls.__subclasses__() for s in subclasses(sub))]

    classes = {c for c in subclasses(ApiError) if c.__module__ == errors.__name__}
    assert {c.status for c in classes} | {429, 503} <= set(status.CODE_BY_STATUS)
    assert grpc.StatusCode.OK not in status.CODE_BY_STATUS.values()
    # google.rpc's numbering is grpc's, so a detail never contradicts its status.
    assert code_pb2.RESOURCE_EXHAUSTED == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]


def _details(answer: grpc.Status) -> dict[str, Any]:
    (key, raw), *_ = answer.trailing_metadata
    assert key == "grpc-status-details-bin"
    rich = status_pb2.Status.FromString(raw)
    assert rich.code == answer.code.value[0] and rich.message == answer.details
    found = {}
    for packed in rich.details:
        for kind in (
            error_details_pb2.ErrorInfo,
            error_details_pb2.BadRequest,
            error_details_pb2.RetryInfo,
            error_details_pb2.ResourceInfo,
        ):
            if packed.Is(kind.DESCRIPTOR):
                found[kind.DESCRIPTOR.name] = kind()
                packed.Unpack(found[kind.DESCRIPTOR.name])
    return found


def test_a_reused_key_is_already_exists_with_the_job_as_resource() -> None:
    job_id = str(uuid.UUID(int=5))
    error = Conflict(
        "used for job", code="idempotency_key_reused", details={"job_id": job_id, "status_url": "/x"}
    )

    answer = status.to_status(error)
    found = _details(answer)

    assert answer.code == grpc.StatusCode.ALREADY_EXISTS
    assert found["ResourceInfo"].resource_name == job_id
    assert dict(found["ErrorInfo"].metadata) == {"job_id": job_id, "status_url": "/x"}
    assert status.grpc_code(Conflict("x", code="job_already_finished")) == grpc.StatusCode.FAILED_PRECONDITION
    assert status.grpc_code(Conflict("x", code="idempotency_key_in_flight")) == grpc.StatusCode.ABORTED


def test_refusals_with_retry_after_carry_retry_info() -> None:
    quota = ApiError(
        "over",
        status=429,
        code="tenant_quota_exceeded",
        headers={"Retry-After": "30"},
        details={"limit": "pending_jobs", "current": 3, "maximum": 3, "retry_after_seconds": 30},
    )
    backlog = ApiError("full", status=503, code="system_backlog_full", headers={"Retry-After": "60"})

    for error, code, delay in (
        (quota, grpc.StatusCode.RESOURCE_EXHAUSTED, 30),
        (backlog, grpc.StatusCode.UNAVAILABLE, 60),
    ):
        answer = status.to_status(error)
        assert answer.code == code
        assert _details(answer)["RetryInfo"].retry_delay.seconds == delay
    assert _details(status.to_status(quota))["ErrorInfo"].metadata["current"] == "3"


def test_schema_violations_become_one_field_violation_each() -> None:
    error = Unprocessable(
        "bad",
        details={
            "errors": [
                {"path": "/options/language", "message": "does not match"},
                {"path": "/", "message": "send either `document` or ..."},
            ]
        },
    )

    found = _details(status.to_status(error))

    assert [(v.field, v.description) for v in found["BadRequest"].field_violations] == [
        ("options.language", "does not match"),
        ("document", "send either `document` or ..."),
    ]
    assert "errors" not in found["ErrorInfo"].metadata


def _batch_row(state: str) -> dict[str, Any]:
    return {
        "id": uuid.UUID(int=21),
        "state": state,
        "priority": "interactive",
        "total": 5,
        "accepted": 5,
        "succeeded": 2,
        "review_required": 1,
        "failed": 1,
        "rejected": 0,
        "cancelled": 1 if state != "running" else 0,
        "created_at": NOW - timedelta(seconds=60),
        "completed_at": NOW if state in batch_views.DONE else None,
        "now": NOW,
    }


@pytest.mark.parametrize("state", batch_schemas.BATCH_STATES)
def test_every_field_of_the_http_batch_bodies_has_its_place_in_the_messages(state: str) -> None:
    row = _batch_row(state)
    status = batch_views.status_body(row, 1.5)
    accepted = batch_views.accepted_body(
        row, estimated_seconds=30, replay=False, expected_jobs_per_second=1.5
    )

    message = messages.batch_status(status)
    response = messages.batch_response(accepted, replayed=False)

    wire = f"BATCH_STATE_{state.upper()}"
    assert message == _strict({**status, "state": wire, "priority": "PRIORITY_INTERACTIVE"}, pb.BatchStatus())
    assert response == _strict({**accepted, "state": wire, "replayed": False}, pb.SubmitBatchResponse())
    assert message.message == status["message"] and message.done is status["done"]
    assert set(batch_schemas.BATCH_STATUS["properties"]) <= set(pb.BatchStatus.DESCRIPTOR.fields_by_name)
    assert set(batch_schemas.BATCH_ACCEPTED["properties"]) <= set(
        pb.SubmitBatchResponse.DESCRIPTOR.fields_by_name
    )


@pytest.mark.parametrize("state", sorted(states.ALL))
def test_every_field_of_a_batch_item_has_its_place(state: str) -> None:
    item = batch_views.item_body(
        {
            **_row(state),
            "batch_index": 4,
            "idempotency_key": "run-7 #4",
            "error_class": "provider_timeout" if state != states.CANCELLED else None,
        }
    )

    page = messages.batch_items({"batch_id": str(uuid.UUID(int=21)), "items": [item], "next_cursor": "c"})

    converted = {**item, "state": f"JOB_STATE_{state}"}
    if "error" in converted:
        converted["error"] = {"error_class": item["error"]["class"], "message": item["error"]["message"]}
    assert page.items[0] == _strict(converted, pb.BatchItem())
    assert set(batch_schemas.BATCH_ITEM["properties"]) <= set(pb.BatchItem.DESCRIPTOR.fields_by_name)


def test_a_batch_request_becomes_the_http_body_the_same_parser_accepts() -> None:
    request = pb.SubmitBatchRequest(
        idempotency_key="run-7",
        items=[
            pb.BatchItemRequest(document=pb.InlineDocument(text="A")),
            pb.BatchItemRequest(
                document_id=str(uuid.UUID(int=3)),
                document_version=2,
                options=pb.Options(language="de"),
                idempotency_key="own",
            ),
        ],
        priority=pb.PRIORITY_BATCH,
        options=pb.Options(language="tr"),
    )

    body = messages.submit_batch_body(request)
    batch = BatchParser(AcceptanceSettings()).create_batch(body)

    assert body == {
        "items": [
            {"document": {"text": "A"}},
            {
                "document_id": str(uuid.UUID(int=3)),
                "document_version": 2,
                "options": {"language": "de"},
                "idempotency_key": "own",
            },
        ],
        "priority": "batch",
        "options": {"language": "tr"},
    }
    assert [item.job.options for item in batch.items] == [{"language": "tr"}, {"language": "de"}]
    assert [item.idempotency_key for item in batch.items] == [None, "own"]


def test_an_error_about_a_batch_item_names_the_item_field() -> None:
    schema = Unprocessable(
        "bad", details={"errors": [{"path": "/items/3/document/text", "message": "empty"}]}
    )
    too_large = ApiError("item 2: too large", status=413, code="document_too_large", details={"index": 2})
    twice = Unprocessable("same key", code="duplicate_item_key", details={"indexes": [0, 4]})

    assert status.field_violations(schema) == [("items[3].document.text", "empty")]
    assert status.field_violations(too_large) == [("items[2].document.text", "item 2: too large")]
    assert status.field_violations(twice)[0][0] == "items[4].idempotency_key"


def test_a_transient_failure_is_unavailable_with_a_delay_and_anything_else_is_internal() -> None:
    for transient in (psycopg.OperationalError("server closed the connection"), PoolTimeout("no connection")):
        error = as_api_error(transient)
        assert status.grpc_code(error) == grpc.StatusCode.UNAVAILABLE
        assert status.retry_after_seconds(error) == 5
    unexpected = as_api_error(ValueError("a bug, with words that stay in the log"))
    assert status.grpc_code(unexpected) == grpc.StatusCode.INTERNAL
    assert "bug" not in unexpected.message


def test_a_watch_response_is_its_events_entries_joined() -> None:
    first = pb.WatchEvent(job_event=pb.JobEvent(seq=7, job_id="a", state=pb.JOB_STATE_RUNNING))
    second = pb.WatchEvent(end=pb.StreamEnd(reason="shutdown", message="x" * 300))  # a 2-byte length

    joined = watch.entry(first) + watch.entry(second)

    assert pb.WatchResponse.FromString(joined) == pb.WatchResponse(events=[first, second])
    assert pb.WatchResponse.FromString(watch.HEARTBEAT).events == []
