"""Permit ids: ``<pool>/<tenant>/<digest of request_key>``.

Derived from the request_key, so a retried Acquire finds the permit the first attempt took, and a
release names every Redis key it needs (pool and tenant) from the id alone.
"""

from __future__ import annotations

import hashlib
import re

from services.limiter.errors import InvalidArgument

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
"""Pool and tenant names: they become part of Redis keys and permit ids, so no '{', '}' or '/'."""

_DIGEST = re.compile(r"^[0-9a-f]{32}$")


def permit_id_for(pool: str, tenant: str, request_key: str) -> str:
    digest = hashlib.blake2b(request_key.encode("utf-8"), digest_size=16).hexdigest()
    return f"{pool}/{tenant}/{digest}"


def parse_permit_id(permit_id: str) -> tuple[str, str, str]:
    """Return (pool, tenant, digest) or raise ``InvalidArgument``."""
    parts = permit_id.split("/")
    if len(parts) != 3 or not NAME.match(parts[0]) or not NAME.match(parts[1]) or not _DIGEST.match(parts[2]):
        shown = permit_id[:200]
        raise InvalidArgument(f"malformed permit_id {shown!r}: expected <pool>/<tenant>/<32 hex digits>")
    return parts[0], parts[1], parts[2]
