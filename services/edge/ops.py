"""Operator routes on the HTTP edge (``/v1/ops/...``), opened only by an operator-scoped key.

Dead letters: read them, and ask for a redrive. The edge only writes the request into the database;
the scheduler of each queue's service publishes the stored message (``services/common/deadletters``),
so the edge never talks to RabbitMQ. Across tenants (``ops_store``): any job with its whole attempt
log and raw error text, the inbox quarantine, webhook endpoint health, the limiter's pools. Thin:
parse, call one function, map errors.
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.common import deadletters
from services.common.api.context import ApiContext
from services.common.api.context import only_query as _only_query
from services.common.api.errors import ApiError, NotFound, Unavailable, Unprocessable
from services.common.api.schema import RequestValidator
from services.edge import ops_store
from services.edge.ops_schemas import ENDPOINT_STATES, INBOXES, MAX_ID, MAX_LIST_LIMIT, REDRIVE_REQUEST
from services.limiter import LimiterClient, LimiterError, LimiterUnauthenticated

log = logging.getLogger(__name__)

_redrive = RequestValidator(REDRIVE_REQUEST)
_SELECTORS = ("ids", "since", "reason", "queue")


def _text(value: str, name: str, error: type[ApiError] = ApiError) -> str:
    if not 1 <= len(value) <= 200 or "\x00" in value:
        raise error(f"{name} must have 1 to 200 characters and no NUL", code=f"invalid_{name}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise error(
            f"{name} holds an unpaired surrogate and is not valid Unicode", code=f"invalid_{name}"
        ) from None
    return value


def _since(value: str, error: type[ApiError] = ApiError) -> datetime:
    try:
        return deadletters.parse_since(value)
    except ValueError as exc:
        raise error(str(exc), code="invalid_since") from None


def _dead_letter_id(raw: str) -> int | None:
    if raw.isascii() and raw.isdigit() and 1 <= int(raw) <= MAX_ID:
        return int(raw)
    return None


def _limit(request: Request, default: int = 100) -> int:
    raw = request.query_params.get("limit", str(default))
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise ApiError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", code="invalid_query")
    return int(raw)


def _choice(request: Request, name: str, allowed: tuple[str, ...]) -> str | None:
    value = request.query_params.get(name)
    if value is not None and value not in allowed:
        raise ApiError(f"{name} must be one of {', '.join(allowed)}", code="invalid_query")
    return value


def _uuid(raw: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(raw) if len(raw) <= 36 else None
    except ValueError:
        return None


def ops_routes(edge: ApiContext, queue_prefix: str, limiter: LimiterClient | None = None) -> list[BaseRoute]:
    """``limiter``: the client the pool view asks; by default one built from ``FATURA_LIMITER_*``
    (a gRPC channel connects on its first call, not here)."""
    pool = edge.pool
    limiter_client = limiter if limiter is not None else LimiterClient.from_settings()

    async def list_dead_letters(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request, "since", "reason", "queue", "include_redriven", "limit")
        q = request.query_params
        include = q.get("include_redriven", "false")
        if include not in ("true", "false"):
            raise ApiError("include_redriven must be true or false", code="invalid_query")
        raw_limit = q.get("limit", "100")
        if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT:
            raise ApiError(f"limit must be an integer from 1 to {MAX_LIST_LIMIT}", code="invalid_query")
        queue = q.get("queue")
        letters = await deadletters.listing_async(
            pool,
            since=_since(q["since"]) if "since" in q else None,
            reason=_text(q["reason"], "reason") if "reason" in q else None,
            queue=deadletters.queue_named(_text(queue, "queue"), queue_prefix) if queue is not None else None,
            include_redriven=include == "true",
            limit=int(raw_limit),
        )
        return JSONResponse({"dead_letters": [letter.summary() for letter in letters]})

    async def get_dead_letter(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request)
        raw = request.path_params["dead_letter_id"]
        dead_letter_id = _dead_letter_id(raw)
        letter = await deadletters.get_async(pool, dead_letter_id) if dead_letter_id is not None else None
        if letter is None:
            raise NotFound(f"there is no dead letter {raw[:40]!r}")
        return JSONResponse(letter.as_json())

    async def redrive(request: Request) -> Response:
        principal = await edge.operator(request)
        _only_query(request)
        body = await edge.json_body(request)
        if body == {}:
            raise Unprocessable(
                "name what to redrive: `ids`, or `since`, `reason` and/or `queue`; an empty request "
                "would redrive everything, which this route never does by default",
                code="no_selector",
            )
        _validate(body)
        ids = sorted({int(i) for i in body["ids"]}) if "ids" in body else None  # 7.0 is an integer too
        since = _since(body["since"], Unprocessable) if "since" in body else None
        reason = _text(body["reason"], "reason", Unprocessable) if "reason" in body else None
        queue = body.get("queue")
        if queue is not None:
            queue = deadletters.queue_named(_text(queue, "queue", Unprocessable), queue_prefix)
        already: list[int] = []
        if ids is not None:
            check = await deadletters.check_ids_async(pool, ids)
            if check.unknown:
                raise NotFound(
                    f"there are no dead letters {check.unknown[:20]}; nothing was requested",
                    code="unknown_dead_letters",
                    details={"unknown_ids": check.unknown},
                )
            already = sorted(check.redriven)
        requested = await deadletters.request_redrive_async(
            pool, ids=ids, since=since, reason=reason, queue=queue
        )
        log.info(
            "operator key %s (%s) asked for the redrive of %d dead letter(s) (%d unsendable) by %s",
            principal.prefix,
            principal.label or "no label",
            len(requested.requested),
            len(requested.unsendable),
            {k: body[k] for k in _SELECTORS if k in body},
        )
        answer = {
            "requested": sorted(requested.requested),
            "unsendable": sorted(requested.unsendable),
            "already_redriven": already,
        }
        return JSONResponse(answer, status_code=202)

    async def get_job(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request)
        raw = request.path_params["job_id"]
        job_id = _uuid(raw)
        job = await ops_store.job(pool, job_id) if job_id is not None else None
        if job is None:
            raise NotFound(f"there is no job {raw[:40]!r}", code="job_not_found")
        return JSONResponse(job)

    async def list_quarantine(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request, "inbox", "since", "limit")
        q = request.query_params
        rows = await ops_store.quarantine(
            pool,
            inbox=_choice(request, "inbox", INBOXES),
            since=_since(q["since"]) if "since" in q else None,
            limit=_limit(request),
        )
        return JSONResponse({"quarantine": rows})

    async def list_endpoints(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request, "state", "breaker", "tenant_id", "limit")
        raw_tenant = request.query_params.get("tenant_id")
        tenant_id = _uuid(raw_tenant) if raw_tenant is not None else None
        if raw_tenant is not None and tenant_id is None:
            raise ApiError("tenant_id must be a UUID", code="invalid_query")
        rows = await ops_store.endpoints(
            pool,
            state=_choice(request, "state", ENDPOINT_STATES),
            breaker=_choice(request, "breaker", ("open", "closed")),
            tenant_id=tenant_id,
            limit=_limit(request),
        )
        return JSONResponse({"endpoints": rows})

    async def limiter_pools(request: Request) -> Response:
        await edge.operator(request)
        _only_query(request)
        try:
            pools = await ops_store.limiter_pools(limiter_client)
        except LimiterUnauthenticated:
            raise Unavailable(
                "the limiter refused this process's token (FATURA_LIMITER_TOKEN): a configuration "
                "error on the edge, not an outage",
                code="limiter_unauthenticated",
            ) from None
        except LimiterError as exc:
            log.warning("limiter pool status unavailable: %s", exc)
            raise Unavailable(
                "the limiter is not answering; retry after 5 seconds",
                code="limiter_unavailable",
                headers={"Retry-After": "5"},
            ) from None
        return JSONResponse({"pools": pools})

    return [
        Route("/v1/ops/jobs/{job_id}", get_job, methods=["GET"], name="ops_get_job"),
        Route("/v1/ops/quarantine", list_quarantine, methods=["GET"], name="ops_list_quarantine"),
        Route("/v1/ops/endpoints", list_endpoints, methods=["GET"], name="ops_list_endpoints"),
        Route("/v1/ops/limiter/pools", limiter_pools, methods=["GET"], name="ops_limiter_pools"),
        Route("/v1/ops/dead-letters", list_dead_letters, methods=["GET"], name="ops_list_dead_letters"),
        Route("/v1/ops/dead-letters:redrive", redrive, methods=["POST"], name="ops_redrive_dead_letters"),
        Route(
            "/v1/ops/dead-letters/{dead_letter_id}",
            get_dead_letter,
            methods=["GET"],
            name="ops_get_dead_letter",
        ),
    ]


def _validate(body: Any) -> None:
    found = sorted(_redrive.iter_errors(body), key=lambda e: list(e.absolute_path))
    if found:
        problems = [
            {"path": "/" + "/".join(str(p) for p in e.absolute_path), "message": e.message[:300]}
            for e in found[:10]
        ]
        raise Unprocessable(
            "the request does not match the schema: "
            + "; ".join(f"{p['path']}: {p['message']}" for p in problems),
            details={"errors": problems},
        )
