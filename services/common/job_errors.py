"""What a tenant is told about a job's error: a stable class and a message written for the tenant.

The worker stores the raw story in ``extraction_jobs.error_message`` (a provider's own text, the
worker's ``hostname:pid``, the limiter's denial): that is for the operator's attempt log
(``GET /v1/ops/jobs/{id}``), never for the tenant (seed §6: internal retry details need a separate
operations authority). Every tenant-facing body (the job status, batch items, the webhook payload,
the gRPC JobService) goes through ``tenant_error``; the table below is the only place the words live.
"""

from __future__ import annotations

from typing import Final

from services.common import states

# The class a tenant sees when the stored one is not in the table (a new class nobody described
# yet): never the stored name, which might say more than it should.
UNKNOWN: Final = "internal_error"
# A reviewer's own reason is the tenant's words (their reviewer key), shown as written.
REVIEW_REJECTED: Final = "review_rejected"

_RETRY = "Fatura retries it automatically within the job's retry budget and deadline."

TENANT_MESSAGES: Final[dict[str, str]] = {
    # The model provider (services/inference/providers/base.py ErrorClass).
    "rate_limited": f"The model provider was at capacity. {_RETRY}",
    "server_error": f"The model provider had a temporary failure. {_RETRY}",
    "connection_error": f"The model provider could not be reached. {_RETRY}",
    "header_timeout": f"The model provider did not answer in time. {_RETRY}",
    "deadline_exceeded": "The job's deadline passed before an extraction could finish.",
    "stream_error": f"The model provider stopped its answer with an error. {_RETRY}",
    "bad_request": "The model provider refused the request for this document; it will not be retried.",
    "unauthorized": "The extraction service is not authorised by the model provider; the operators "
    "have been alerted. It will not be retried.",
    "payment_required": "The extraction service's model provider account cannot take requests; the "
    "operators have been alerted. It will not be retried.",
    "not_found": "The model this job asks for is not available; it will not be retried.",
    "bad_response": f"The model provider's answer could not be read. {_RETRY}",
    "no_channel": f"No route to the model is available for the moment. {_RETRY}",
    "cancelled": f"An attempt was interrupted. {_RETRY}",
    # The model's answer (services/inference/validation ModelErrorClass).
    "broken_json": f"The model's answer was not valid JSON. {_RETRY}",
    "schema_violation": f"The model's answer did not match the invoice schema. {_RETRY}",
    "too_large": f"The model's answer was larger than allowed. {_RETRY}",
    "model_error": f"The model's answer was not a usable extraction. {_RETRY}",
    # The worker and the scheduler (services/inference/outcomes.py, scheduler.py).
    "worker_error": f"An attempt failed inside the extraction service. {_RETRY}",
    "deferred": "Waiting for model capacity; no attempt was spent. It starts as soon as capacity frees.",
    "lease_expired": f"An attempt did not finish (the extraction worker stopped). {_RETRY}",
    # The limiter (services/inference/claims.py): no wait could ever admit the job.
    "document_too_large_for_model": "The document is too long for the model: its text and the "
    "longest answer allowed need more context than the model's server can hold at once. It will "
    "not be retried; split the document or send it to a larger model.",
    # A reviewer's decision (services/inference/review).
    REVIEW_REJECTED: "A reviewer rejected the extraction.",
    UNKNOWN: "The extraction failed inside the extraction service.",
}

_NO_RETRY = "No retry is left: the job has failed."
_CANCELLED = {"class": "cancelled", "message": "The job was cancelled; no result will be produced."}


def tenant_error(error_class: str | None, raw_message: str | None, state: str) -> dict[str, str]:
    """``{"class", "message"}`` for a tenant about a job in ``state``. In a final state no retry
    follows, so a message promising one says that none is left instead."""
    if state == states.CANCELLED:
        return dict(_CANCELLED)
    cls = error_class if error_class in TENANT_MESSAGES else UNKNOWN
    if cls == REVIEW_REJECTED and raw_message:
        return {"class": cls, "message": raw_message}
    message = TENANT_MESSAGES[cls]
    if state in states.FINAL and message.endswith(_RETRY):
        message = message.removesuffix(_RETRY) + _NO_RETRY
    return {"class": cls, "message": message}
