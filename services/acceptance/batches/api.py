"""HTTP routes of extraction batches, mounted with acceptance's routes by the edge. Thin: parse, call
one ``BatchService`` method, let typed errors map to status codes.

A batch body has a size cap of its own (``FATURA_MAX_BATCH_BODY_BYTES``): it carries many inline
documents, each still held to ``FATURA_MAX_DOCUMENT_BYTES``.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.acceptance.batches import requests
from services.acceptance.batches.requests import BatchParser
from services.acceptance.batches.service import BatchService
from services.acceptance.idempotency import validate_key
from services.acceptance.requests import RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.common.api.body import JsonBody
from services.common.api.context import ApiContext, json_response, only_query
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
        # Validating 10,000 items takes about a second of CPU: off the event loop, so this worker's
        # other requests are served meanwhile.
        batch = await asyncio.to_thread(parser.create_batch, raw)
        accepted = await batches.submit(tenant, key, batch)
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
        query = requests.list_items(q.get("state"), q.get("cursor"), q.get("limit"))
        batch_id = parse_uuid(request.path_params["batch_id"])
        page = await batches.items(
            tenant, batch_id, state=query.state, cursor=query.cursor, limit=query.limit
        )
        return json_response(page)

    return [
        Route("/v1/extraction-batches", create_batch, methods=["POST"], name="create_batch"),
        Route("/v1/extraction-batches/{batch_id}", get_batch, methods=["GET"], name="get_batch"),
        Route(
            "/v1/extraction-batches/{batch_id}/items", list_items, methods=["GET"], name="list_batch_items"
        ),
    ]
