"""The acceptance service's HTTP routes (documents and extraction jobs), mounted by the edge.

Thin: parse, call one service function, and let typed errors map to status codes.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.acceptance import requests
from services.acceptance.accept import Acceptor
from services.acceptance.batches.api import batch_routes
from services.acceptance.documents import store_document
from services.acceptance.idempotency import validate_key
from services.acceptance.jobs import JobService
from services.acceptance.requests import RequestParser
from services.acceptance.settings import AcceptanceSettings
from services.common.api.context import ApiContext, json_response, only_query
from services.common.ids import parse_uuid
from services.common.uow import OutboxNotifier


def acceptance_routes(ctx: ApiContext, settings: AcceptanceSettings) -> list[BaseRoute]:
    notifier = OutboxNotifier(ctx.pool)
    parser = RequestParser(settings)
    jobs = JobService(ctx.pool, notifier)
    acceptor = Acceptor(ctx.pool, notifier, settings)

    async def create_document(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        parsed = parser.create_document(await ctx.json_body(request))
        stored = await store_document(
            ctx.pool, tenant, parsed, retry_after_seconds=settings.admission_retry_after_seconds
        )
        return json_response(stored, 201)

    async def create_job(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        body = await ctx.json_body(request)
        key = validate_key(request.headers.get("idempotency-key"))
        accepted = await acceptor.accept(tenant, key, parser.create_job(body))
        headers = {"Location": accepted.body["status_url"]}
        if accepted.replay:
            headers["Idempotent-Replayed"] = "true"
        return json_response(accepted.body, 202, headers)

    async def list_jobs(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request, "state", "cursor", "limit")
        q = request.query_params
        query = requests.list_jobs(q.get("state"), q.get("cursor"), q.get("limit"))
        return json_response(
            await jobs.list(tenant, state=query.state, cursor=query.cursor, limit=query.limit)
        )

    async def get_job(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        return json_response(await jobs.get(tenant, parse_uuid(request.path_params["job_id"])))

    async def cancel_job(request: Request) -> Response:
        tenant = await ctx.tenant(request)
        only_query(request)
        return json_response(await jobs.cancel(tenant, parse_uuid(request.path_params["job_id"])))

    return [
        Route("/v1/documents", create_document, methods=["POST"], name="create_document"),
        Route("/v1/extraction-jobs", create_job, methods=["POST"], name="create_job"),
        Route("/v1/extraction-jobs", list_jobs, methods=["GET"], name="list_jobs"),
        Route("/v1/extraction-jobs/{job_id}:cancel", cancel_job, methods=["POST"], name="cancel_job"),
        Route("/v1/extraction-jobs/{job_id}", get_job, methods=["GET"], name="get_job"),
        *batch_routes(ctx, settings, notifier, parser),
    ]
