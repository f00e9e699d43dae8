"""Bearer API-key authentication with a short in-process cache (revocation takes effect within its TTL).

A key opens only the routes of its scope (``services/common/api/apikeys.py``): tenant routes ask for
``authenticate`` (a tenant key), review routes for ``reviewer``, operator routes for ``operator``.
A valid key of another scope is 403, so a caller learns it holds the wrong kind of key, not a bad
one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg_pool import AsyncConnectionPool

from services.common.api import apikeys
from services.common.api.apikeys import OPERATOR, REVIEWER, TENANT
from services.common.api.errors import Forbidden, Unauthorized
from services.common.api.tenancy import Tenant, tenant_from_row
from services.common.api.throttle import FailureThrottle
from services.common.queries import load_queries

Q = load_queries(Path(__file__).resolve().parents[1] / "sql" / "auth.sql")
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="fatura"'}
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class Principal:
    """Who a valid, unrevoked key speaks for."""

    prefix: str
    scope: str
    label: str | None
    tenant: Tenant | None  # None for an operator key


def _unauthorized(message: str) -> Unauthorized:
    return Unauthorized(message, headers=_CHALLENGE)


def bearer_token(header: str | None) -> str:
    if not header:
        raise _unauthorized("missing API key: send 'Authorization: Bearer <api key>'")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("the Authorization header must be 'Bearer <api key>'")
    return token.strip()


class Authenticator:
    def __init__(
        self, pool: AsyncConnectionPool[Any], ttl_seconds: float, throttle: FailureThrottle | None = None
    ) -> None:
        self._pool = pool
        self._ttl = ttl_seconds
        self._throttle = throttle or FailureThrottle(0, 60.0, 0.0)
        self._cache: OrderedDict[bytes, tuple[float, Principal | None]] = OrderedDict()

    async def authenticate(self, authorization: str | None, client: str | None = None) -> Tenant:
        """The tenant of a tenant-scoped key."""
        principal = await self.tenant_key(authorization, client)
        assert principal.tenant is not None
        return principal.tenant

    async def tenant_key(self, authorization: str | None, client: str | None = None) -> Principal:
        """A tenant-scoped key, with its prefix (a long stream watches it for revocation)."""
        principal = await self.principal(authorization, client)
        if principal.scope != TENANT or principal.tenant is None:
            raise Forbidden(
                f"this key's scope is {principal.scope}; this route takes a tenant's key",
                details={"key_scope": principal.scope, "required_scope": TENANT},
            )
        return principal

    async def reviewer(self, authorization: str | None, client: str | None = None) -> Principal:
        """A reviewer-scoped key: bound to one tenant, it opens that tenant's reviews only."""
        principal = await self.principal(authorization, client)
        if principal.scope != REVIEWER or principal.tenant is None:
            raise Forbidden(
                "this route takes a reviewer key (fatura keys create --tenant ID --scope reviewer); "
                f"this key's scope is {principal.scope}",
                details={"key_scope": principal.scope, "required_scope": REVIEWER},
            )
        return principal

    async def operator(self, authorization: str | None, client: str | None = None) -> Principal:
        """An operator-scoped key."""
        principal = await self.principal(authorization, client)
        if principal.scope != OPERATOR:
            raise Forbidden(
                f"this route takes an operator key (fatura keys create --operator); this key's "
                f"scope is {principal.scope}",
                details={"key_scope": principal.scope, "required_scope": OPERATOR},
            )
        return principal

    async def principal(self, authorization: str | None, client: str | None = None) -> Principal:
        """Who the key speaks for. ``client`` is the caller's address: too many invalid keys from one
        address block it for a while (``FailureThrottle``)."""
        self._throttle.check(client)
        token = bearer_token(authorization)
        prefix = apikeys.parse(token)
        if prefix is None:
            self._throttle.failed(client)
            raise _unauthorized("the API key is not valid")
        cache_key = apikeys.digest(token)
        now = time.monotonic()
        cached = self._cache.get(cache_key)
        if cached is not None and cached[0] > now:
            principal = cached[1]
        else:
            principal = await self._lookup(prefix, token)
            self._remember(cache_key, (now + self._ttl, principal))
        if principal is None:
            self._throttle.failed(client)
            raise _unauthorized("the API key is not valid or has been revoked")
        return principal

    def _remember(self, key: bytes, entry: tuple[float, Principal | None]) -> None:
        if self._ttl <= 0:
            return
        self._cache[key] = entry
        self._cache.move_to_end(key)
        while len(self._cache) > _MAX_CACHED:
            self._cache.popitem(last=False)

    async def _lookup(self, prefix: str, token: str) -> Principal | None:
        async with self._pool.connection() as conn:
            row = await (await conn.execute(Q["authenticate"], {"prefix": prefix})).fetchone()
        # A revocation in the future (a rotated key's grace period) has not taken effect yet.
        if row is None or not apikeys.matches(token, row["secret_hash"]):
            return None
        tenant = None
        if row["id"] is not None:
            tenant = tenant_from_row(row)
        return Principal(prefix=prefix, scope=row["scope"], label=row["label"], tenant=tenant)
