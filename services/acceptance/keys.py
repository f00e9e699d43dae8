"""API keys and their scopes (DESIGN §6): create one (the plaintext is returned once), list, revoke.

A ``tenant`` key opens the tenant's own jobs, endpoints and deliveries; a ``reviewer`` key is bound
to one tenant and opens its reviews; an ``operator`` key belongs to no tenant and opens the
cross-tenant operator routes (``/v1/ops/...``) and nothing else.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg_pool import ConnectionPool

from services.acceptance.queries import Q
from services.common.api import apikeys
from services.common.api.apikeys import OPERATOR, SCOPES
from services.common.ids import new_id

MAX_LABEL = 200


class KeyRequestError(ValueError):
    """The key cannot be made or found as asked; nothing was written."""


@dataclass(frozen=True)
class KeyInfo:
    """A key as an operator may see it: never the secret, never its hash."""

    prefix: str
    scope: str
    label: str | None
    tenant_id: uuid.UUID | None
    created_at: datetime
    revoked_at: datetime | None

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> KeyInfo:
        return cls(**{name: row[name] for name in cls.__dataclass_fields__})

    def as_json(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "scope": self.scope,
            "label": self.label,
            "tenant_id": str(self.tenant_id) if self.tenant_id else None,
            "created_at": self.created_at.isoformat(),
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


def check_request(scope: str, tenant_id: uuid.UUID | None, label: str | None) -> None:
    """A tenant or reviewer key names its tenant; an operator key names none."""
    if scope not in SCOPES:
        raise KeyRequestError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if scope == OPERATOR and tenant_id is not None:
        raise KeyRequestError("an operator key belongs to no tenant; leave out the tenant")
    if scope != OPERATOR and tenant_id is None:
        raise KeyRequestError(f"a {scope} key belongs to one tenant; name it")
    if label is not None and not (1 <= len(label) <= MAX_LABEL and "\x00" not in label):
        raise KeyRequestError(f"a label has 1 to {MAX_LABEL} characters and no NUL")


def create_key(
    pool: ConnectionPool[Any], *, scope: str, tenant_id: uuid.UUID | None = None, label: str | None = None
) -> tuple[KeyInfo, str]:
    """Store a new key; returns it and its plaintext, which exists nowhere else from now on."""
    check_request(scope, tenant_id, label)
    key = apikeys.generate()
    params = {
        "id": new_id(),
        "tenant_id": tenant_id,
        "prefix": key.prefix,
        "secret_hash": key.secret_hash,
        "scope": scope,
        "label": label,
    }
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(Q["create_scoped_api_key"], params).fetchone()
    if row is None:
        raise KeyRequestError(f"there is no tenant {tenant_id}")
    return KeyInfo.from_row(row), key.plaintext


def list_keys(
    pool: ConnectionPool[Any], *, tenant_id: uuid.UUID | None = None, operator: bool = False
) -> list[KeyInfo]:
    """A tenant's keys, the operator keys, or (with neither) every key; oldest first."""
    with pool.connection() as conn:
        rows = conn.execute(Q["list_api_keys"], {"tenant_id": tenant_id, "operator": operator}).fetchall()
    return [KeyInfo.from_row(r) for r in rows]


def rotate_key(
    pool: ConnectionPool[Any], prefix: str, *, grace_seconds: float
) -> tuple[KeyInfo, KeyInfo, str]:
    """Replace a key: a new one with the same scope, tenant and label, and the old one revoked once
    ``grace_seconds`` have passed (0: at once), so its holders can switch without an outage.
    Returns the old key (with its revocation time), the new one, and the new plaintext."""
    if not 0 <= grace_seconds <= 30 * 86_400:
        raise KeyRequestError("the grace period is 0 to 30 days")
    prefix = _bare_prefix(prefix)
    key = apikeys.generate()
    with pool.connection() as conn, conn.transaction():
        old = conn.execute(Q["rotate_api_key"], {"prefix": prefix, "grace_seconds": grace_seconds}).fetchone()
        if old is None:
            raise KeyRequestError(f"there is no key with the prefix {prefix!r} that is still valid")
        new = conn.execute(
            Q["create_scoped_api_key"],
            {
                "id": new_id(),
                "tenant_id": old["tenant_id"],
                "prefix": key.prefix,
                "secret_hash": key.secret_hash,
                "scope": old["scope"],
                "label": old["label"],
            },
        ).fetchone()
    assert new is not None
    return KeyInfo.from_row(old), KeyInfo.from_row(new), key.plaintext


def _bare_prefix(prefix: str) -> str:
    if prefix.startswith("fat_"):  # the whole key, or fat_<prefix>
        return prefix.split("_")[1]
    return prefix


def revoke_key(pool: ConnectionPool[Any], prefix: str) -> KeyInfo:
    """Revoke the key with this prefix (``fat_<prefix>_...``); revoking twice is a no-op. The edge
    stops accepting it within its auth cache's TTL."""
    prefix = _bare_prefix(prefix)
    with pool.connection() as conn, conn.transaction():
        row = conn.execute(Q["revoke_api_key"], {"prefix": prefix}).fetchone()
    if row is None:
        raise KeyRequestError(f"there is no key with the prefix {prefix!r}")
    return KeyInfo.from_row(row)
