"""HTTP routes of extraction batches, mounted with acceptance's routes by the edge. Thin: parse, call
one ``BatchService`` method, let typed errors map to status codes.

A batch body has a size cap of its own (``FATURA_MAX_BATCH_BODY_BYTES``): it carries many inline
documents, each still held to ``FATURA_MAX_DOCUMENT_BYTES``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.acceptance.batches import schemas
from services.acceptance.batches.requests import BatchParser
from services.acceptance.batches.service import BatchService, valid_state_filter
from services.acceptance.batches.views import ERRORS
from services.acceptance.idempotency import validate_key
from services.acceptance.requests import RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.common.api.body import JsonBody
from services.common.api.context import ApiContext, json_response, only_query
from services.common.api.errors import ApiError
from services.common.ids import parse_uuid
from services.common.uow import OutboxNotifier


def batch_routes(
    ctx: ApiContext, settings: AcceptanceSettings, notifier: OutboxNotifier, jobs: RequestParser
) -> list[BaseRoute]:
    batches = BatchService(ctx.pool, notifier, settings)
    parser = BatchParser(settings, jobs)
    body = JsonBody(settings.max_batch_body_bytes)

    async def create_batch(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        raw = await body.read(request)
        key = validate_key(request.headers.get("idempotency-key"))
        accepted = await batches.submit(tenant, key, parser.create_batch(raw))
        headers = {"Location": accepted.body["status_url"]}
        if accepted.replay:
            headers["Idempotent-Replayed"] = "true"
        return json_response(accepted.body, 202, headers)

    async def get_batch(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        return json_response(await batches.get(tenant, parse_uuid(request.path_params["batch_id"])))

    async def list_items(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request, "state", "cursor", "limit")
        q = request.query_params
        state = q.get("state")
        if state is not None and not valid_state_filter(state):
            raise ApiError(
                f"state must be a job state or {ERRORS!r} (every item without a result)", code="invalid_query"
            )
        raw_limit = q.get("limit", "50")
        most = schemas.MAX_ITEMS_LIMIT
        if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= most:
            raise ApiError(f"limit must be an integer from 1 to {most}", code="invalid_query")
        cursor = q.get("cursor")
        batch_id = parse_uuid(request.path_params["batch_id"])
        page = await batches.items(tenant, batch_id, state=state, cursor=cursor, limit=int(raw_limit))
        return json_response(page)

    return [
        Route("/v1/extraction-batches", create_batch, methods=["POST"], name="create_batch"),
        Route("/v1/extraction-batches/{batch_id}", get_batch, methods=["GET"], name="get_batch"),
        Route(
            "/v1/extraction-batches/{batch_id}/items", list_items, methods=["GET"], name="list_batch_items"
        ),
    ]
