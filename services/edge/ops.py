"""Operator routes on the HTTP edge (``/v1/ops/...``), opened only by an operator-scoped key.

Dead letters: read them, and ask for a redrive. The edge only writes the request into the database;
the scheduler of each queue's service publishes the stored message (``services/common/deadletters``),
so the edge never talks to RabbitMQ. Thin: parse, call one function, map errors.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.common import deadletters
from services.common.api.context import ApiContext
from services.common.api.context import only_query as _only_query
from services.common.api.errors import ApiError, NotFound, Unprocessable
from services.common.api.schema import RequestValidator
from services.edge.ops_schemas import MAX_ID, MAX_LIST_LIMIT, REDRIVE_REQUEST

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


def ops_routes(edge: ApiContext, queue_prefix: str) -> list[BaseRoute]:
    pool = edge.pool

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

    return [
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
