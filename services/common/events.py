"""Outbox event types and where the relay sends each one.

Messages carry ids and versions, never invoice text: consumers read tenant and document from the
database (DESIGN §5.3).
"""

from __future__ import annotations

from dataclasses import dataclass

EXTRACTION_REQUESTED = "extraction.requested.v1"
EXTRACTION_CANCELLED = "extraction.cancelled.v1"
EXTRACTION_COMPLETED = "extraction.completed.v1"
EXTRACTION_FAILED = "extraction.failed.v1"
# A reviewer refused the result (REVIEW_REQUIRED -> REJECTED): no result, like a failure.
EXTRACTION_REJECTED = "extraction.rejected.v1"
# A job needs a reviewer: ids, reasons and a review URL, never the unvalidated fields. Only
# endpoints that subscribe to it explicitly (a review tool) receive it, never an ERP by default.
REVIEW_REQUESTED = "review.requested.v1"
# Every item of a batch is final (services/migrations/0013_batches.sql ``fatura_close_batch``). Its
# subject is the batch: the event carries ``batch_id`` instead of ``job_id``, and its state is the
# batch's (``completed`` or ``completed_with_errors``) at state_version 1 (a batch ends once).
BATCH_COMPLETED = "batch.completed.v1"
BATCH_EVENTS = frozenset({BATCH_COMPLETED})


@dataclass(frozen=True)
class Route:
    """A Dramatiq actor that receives an event type: its queue (without the prefix) and actor name."""

    queue: str
    actor: str


# Every queue a service consumes: its events in, and its wake-ups.
INFERENCE_INGEST = Route("inference.ingest", "ingest")
INFERENCE_RUN = Route("inference.run", "run")
DELIVERY_INGEST = Route("delivery.ingest", "ingest")
DELIVERY_DELIVER = Route("delivery.deliver", "deliver")
SERVICE_ROUTES: dict[str, tuple[Route, ...]] = {
    "inference": (INFERENCE_INGEST, INFERENCE_RUN),
    "delivery": (DELIVERY_INGEST, DELIVERY_DELIVER),
}

# Event type -> every consumer that must receive it. An event type with no route is a bug in the
# writer, and the relay refuses to mark it published.
ROUTES: dict[str, tuple[Route, ...]] = {
    EXTRACTION_REQUESTED: (INFERENCE_INGEST,),
    EXTRACTION_CANCELLED: (INFERENCE_INGEST,),
    EXTRACTION_COMPLETED: (DELIVERY_INGEST,),
    EXTRACTION_FAILED: (DELIVERY_INGEST,),
    EXTRACTION_REJECTED: (DELIVERY_INGEST,),
    REVIEW_REQUESTED: (DELIVERY_INGEST,),
    BATCH_COMPLETED: (DELIVERY_INGEST,),
}


# The most events one message may carry (services/common/event_batches.py).
MAX_EVENTS_PER_MESSAGE = 64


def queue_name(prefix: str, route: Route) -> str:
    return f"{prefix}.{route.queue}"


def event_types_for(route: Route) -> frozenset[str]:
    """The event types the relay sends to ``route``."""
    return frozenset(t for t, routes in ROUTES.items() if route in routes)


def all_queues(prefix: str) -> list[str]:
    """Every queue the services consume under ``prefix``."""
    return [queue_name(prefix, r) for routes in SERVICE_ROUTES.values() for r in routes]
