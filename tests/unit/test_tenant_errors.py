"""A tenant reads a stable error class and words written for it, never a provider's raw text or a
worker's ``hostname:pid`` (seed §6: internal retry details need a separate operations authority)."""

from __future__ import annotations

import typing
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from services.acceptance.views import status_body
from services.common import states
from services.common.job_errors import TENANT_MESSAGES, UNKNOWN, tenant_error
from services.delivery.payload import event_body
from services.inference import scheduler
from services.inference.outcomes import WORKER_ERROR
from services.inference.providers.base import ErrorClass
from services.inference.validation._model import ModelErrorClass

RAW = "upstream gpu-node-17.internal.example:4312 said: CUDA OOM (request 9f2c)"
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _every_stored_class() -> set[str]:
    """Every error class a worker, the scheduler or a reviewer writes to ``extraction_jobs``."""
    return (
        {c.value for c in ErrorClass}
        | set(typing.get_args(ModelErrorClass))
        | {"model_error", "deferred", WORKER_ERROR, scheduler.LEASE_EXPIRED, scheduler.DEADLINE_EXCEEDED}
        | {"review_rejected"}
    )


def test_every_class_the_pipeline_stores_has_words_for_the_tenant() -> None:
    missing = _every_stored_class() - set(TENANT_MESSAGES)
    assert not missing, f"add a tenant message to services/common/job_errors.py for {sorted(missing)}"


@pytest.mark.parametrize("error_class", sorted(TENANT_MESSAGES))
def test_no_tenant_message_carries_the_raw_text(error_class: str) -> None:
    for state in (states.RETRY_SCHEDULED, states.FAILED_TERMINAL):
        error = tenant_error(error_class, RAW, state)
        if error_class == "review_rejected":
            continue  # the tenant's own reviewer wrote it
        assert error["class"] == error_class
        assert "gpu-node-17" not in error["message"] and "4312" not in error["message"]


def test_a_final_state_never_promises_a_retry() -> None:
    scheduled = tenant_error("server_error", RAW, states.RETRY_SCHEDULED)["message"]
    failed = tenant_error("server_error", RAW, states.FAILED_TERMINAL)["message"]
    assert "retries it automatically" in scheduled
    assert "retries it automatically" not in failed and "No retry is left" in failed


def test_an_unknown_class_is_not_shown_by_name() -> None:
    assert tenant_error("gpu_node_17_exploded", RAW, states.FAILED_TERMINAL) == {
        "class": UNKNOWN,
        "message": TENANT_MESSAGES[UNKNOWN],
    }


def test_a_reviewers_reason_is_the_tenants_own_words() -> None:
    assert tenant_error("review_rejected", "wrong supplier", states.REJECTED) == {
        "class": "review_rejected",
        "message": "wrong supplier",
    }


def test_a_cancelled_job_says_it_was_cancelled_whatever_failed_before() -> None:
    assert tenant_error("server_error", RAW, states.CANCELLED)["class"] == "cancelled"


def _job(state: str, **extra: object) -> dict[str, object]:
    job: dict[str, object] = {
        "id": "7b0e8c1e-0000-4000-8000-000000000001",
        "state": state,
        "state_version": 4,
        "attempt": 2,
        "priority": "interactive",
        "document_id": "7b0e8c1e-0000-4000-8000-000000000002",
        "document_version": 1,
        "schema_version": "invoice.v1",
        "created_at": NOW,
        "finished_at": NOW + timedelta(seconds=5),
        "deadline_at": NOW + timedelta(hours=1),
        "available_at": NOW + timedelta(seconds=30),
        "now": NOW + timedelta(seconds=5),
        "review_reasons": None,
        "error_class": "server_error",
        "error_message": f"HTTP 503 from {RAW}; the lease of worker-a.example:4711 expired",
    }
    return job | extra


@pytest.mark.parametrize("state", [states.RETRY_SCHEDULED, states.FAILED_TERMINAL])
def test_the_status_body_hides_the_raw_text(state: str) -> None:
    text = str(status_body(_job(state)))
    assert "server_error" in text
    assert "gpu-node-17" not in text and "worker-a.example" not in text and "4711" not in text


def test_the_webhook_body_hides_the_raw_text() -> None:
    job = _job(states.FAILED_TERMINAL)
    body = event_body(
        event_id=uuid.uuid4(),
        event_type="extraction.failed.v1",
        tenant_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        state=states.FAILED_TERMINAL,
        state_version=4,
        occurred_at=NOW,
        job={k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in job.items()},
    ).decode()
    assert '"class":"server_error"' in body
    assert "gpu-node-17" not in body and "worker-a.example" not in body
