"""A delivery as the API shows it (``GET /v1/deliveries``, ``:resend``, ``:ack``): its state, every
attempt, and the ERP's business acknowledgement."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


def delivery_view(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` is a row of one of the delivery queries that select the delivery with its attempt log."""
    ack = None
    if row["ack_outcome"] is not None:
        ack = {"outcome": row["ack_outcome"], "reason": row["ack_reason"], "acked_at": iso(row["acked_at"])}
    return {
        "delivery_id": str(row["delivery_id"]),
        "event_id": str(row["event_id"]),
        "event_type": row["event_type"],
        "endpoint_id": str(row["endpoint_id"]),
        "job_id": None if row["job_id"] is None else str(row["job_id"]),
        "state": row["state"],
        "reason": row["reason"],
        "attempt_count": row["attempts"],
        "last_status": row["last_status"],
        "next_attempt_at": iso(row["next_attempt_at"]),
        "created_at": iso(row["created_at"]),
        "delivered_at": iso(row["delivered_at"]),
        "ack": ack,
        "attempts": row["attempt_log"],
    }
