"""Outbox event types and where the relay sends each one.

Messages carry ids and versions, never invoice text: consumers read tenant and document from the
database (DESIGN §5.3).
"""

from __future__ import annotations

from dataclasses import dataclass

EXTRACTION_REQUESTED = "extraction.requested.v1"
EXTRACTION_CANCELLED = "extraction.cancelled.v1"
EXTRACTION_COMPLETED = "extraction.completed.v1"
EXTRACTION_REVIEW_REQUIRED = "extraction.review_required.v1"
EXTRACTION_FAILED = "extraction.failed.v1"


@dataclass(frozen=True)
class Route:
    """A Dramatiq actor that receives an event type: its queue (without the prefix) and actor name."""

    queue: str
    actor: str


# Event type -> every consumer that must receive it. An event type with no route is a bug in the
# writer, and the relay refuses to mark it published.
ROUTES: dict[str, tuple[Route, ...]] = {
    EXTRACTION_REQUESTED: (Route("inference.ingest", "ingest"),),
    EXTRACTION_CANCELLED: (Route("inference.ingest", "ingest"),),
    EXTRACTION_COMPLETED: (Route("delivery.ingest", "ingest"),),
    EXTRACTION_REVIEW_REQUIRED: (Route("delivery.ingest", "ingest"),),
    EXTRACTION_FAILED: (Route("delivery.ingest", "ingest"),),
}


def queue_name(prefix: str, route: Route) -> str:
    return f"{prefix}.{route.queue}"
