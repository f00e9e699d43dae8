"""Identifiers: time-ordered UUIDv7 for new rows, so indexes stay append-mostly."""

from __future__ import annotations

import uuid

import uuid_utils

NIL = uuid.UUID(int=0)


def new_id() -> uuid.UUID:
    return uuid.UUID(bytes=uuid_utils.uuid7().bytes)


def parse_uuid(value: str) -> uuid.UUID | None:
    """The UUID in ``value``, or None when it is not one (callers answer 404, not 500)."""
    try:
        return uuid.UUID(value)
    except (ValueError, AttributeError, TypeError):
        return None
