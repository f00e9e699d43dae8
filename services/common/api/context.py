"""``ApiContext``: what the edge hands to every service's routes, and the helpers thin routes share."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from services.common.api.auth import Authenticator, Principal
from services.common.api.body import JsonBody
from services.common.api.errors import ApiError
from services.common.api.tenancy import Tenant
from services.common.db import AsyncPool


class ApiContext:
    """The edge's database pool, authentication and body reader, built once per worker process."""

    def __init__(self, pool: AsyncPool, auth: Authenticator, body: JsonBody) -> None:
        self.pool = pool
        self.auth = auth
        self.body = body

    async def tenant(self, request: Request) -> Tenant:
        """The tenant of the request's tenant-scoped key (401 without one, 403 for another scope)."""
        return await self.auth.authenticate(request.headers.get("authorization"), _client(request))

    async def tenant_key(self, request: Request) -> Principal:
        """``tenant``, with the key's prefix: for a stream that must end when the key is revoked."""
        return await self.auth.tenant_key(request.headers.get("authorization"), _client(request))

    async def reviewer(self, request: Request) -> Principal:
        """The request's reviewer key, bound to one tenant (401 without one, 403 for another scope)."""
        return await self.auth.reviewer(request.headers.get("authorization"), _client(request))

    async def operator(self, request: Request) -> Principal:
        """The request's operator key (401 without one, 403 for another scope)."""
        return await self.auth.operator(request.headers.get("authorization"), _client(request))

    async def json_body(self, request: Request) -> Any:
        return await self.body.read(request)


def _client(request: Request) -> str | None:
    return request.client.host if request.client is not None else None


def only_query(request: Request, *allowed: str) -> None:
    """Refuse query parameters the route does not take (400, naming them)."""
    if not request.scope.get("query_string"):
        return  # nothing to parse: most requests carry no query
    unknown = sorted(set(request.query_params.keys()) - set(allowed))
    if unknown:
        accepted = f"; this route accepts {', '.join(allowed)}" if allowed else "; this route takes none"
        raise ApiError(f"unknown query parameters {unknown}{accepted}", code="invalid_query")


class _JSONResponse(JSONResponse):
    """Starlette's JSONResponse with its encoder built once: ``json.dumps`` with these arguments
    builds a new ``JSONEncoder`` at every call, which cost as much as the encoding of a 202 body.
    The same arguments, so the same bytes."""

    _encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, indent=None, separators=(",", ":"))

    def render(self, content: Any) -> bytes:
        return self._encoder.encode(content).encode("utf-8")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> JSONResponse:
    return _JSONResponse(body, status_code=status, headers=headers)
