"""List cursors: an opaque token for a (created_at, id) position in a keyset-paginated list.

Any token the server did not issue (bad base64, not JSON, wrong fields, a naive timestamp) is a
typed 400 ``invalid_cursor``, never a 500.
"""

from __future__ import annotations

import base64
import binascii
import json
import uuid
from datetime import datetime

from services.common.api.errors import ApiError


def encode_cursor(created_at: datetime, row_id: uuid.UUID) -> str:
    raw = json.dumps({"c": created_at.isoformat(), "i": str(row_id)}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, uuid.UUID]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        raw = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("c"), str)
            or not isinstance(raw.get("i"), str)
        ):
            raise ValueError("not a cursor of ours")
        created_at = datetime.fromisoformat(raw["c"])
        if created_at.tzinfo is None:
            raise ValueError("naive timestamp")
        return created_at, uuid.UUID(raw["i"])
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeEncodeError, binascii.Error):
        raise ApiError("the cursor is not one this server issued", code="invalid_cursor") from None
