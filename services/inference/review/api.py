"""HTTP routes of the review workflow, mounted by the edge; every one takes a reviewer key.

Thin: check the key, parse the body against ``schemas.py``, call one ``Reviews`` method. A refused
request (a claim that is not yours, a correction that does not pass validation) changes nothing.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from services.common.api.context import ApiContext, json_response, only_query
from services.common.api.errors import ApiError, Unprocessable
from services.common.api.schema import RequestValidator
from services.common.ids import parse_uuid
from services.common.settings import env_float
from services.common.uow import OutboxNotifier
from services.inference.review import schemas
from services.inference.review.store import Reviews

_STATES = ("open", "claimed", "decided", "approved", "corrected", "rejected", "all")
_decision = {
    "approve": RequestValidator(schemas.APPROVE),
    "correct": RequestValidator(schemas.CORRECT),
    "reject": RequestValidator(schemas.REJECT),
}


def _validate(validator: RequestValidator, body: Any) -> None:
    found = sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path))
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


def review_routes(ctx: ApiContext, env: dict[str, str]) -> list[BaseRoute]:
    claim_seconds = env_float(env, "FATURA_REVIEW_CLAIM_SECONDS", 900.0, lo=5.0, hi=86_400.0)
    reviews = Reviews(ctx.pool, OutboxNotifier(ctx.pool), claim_seconds)

    async def list_reviews(request: Request) -> Response:
        reviewer = await ctx.reviewer(request)
        only_query(request, "state", "cursor", "limit")
        q = request.query_params
        state = q.get("state", "open")
        if state not in _STATES:
            raise ApiError(f"state must be one of {', '.join(_STATES)}", code="invalid_query")
        raw_limit = q.get("limit", "50")
        if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) <= schemas.MAX_LIMIT:
            raise ApiError(f"limit must be an integer from 1 to {schemas.MAX_LIMIT}", code="invalid_query")
        assert reviewer.tenant is not None
        return json_response(
            await reviews.list(
                reviewer.tenant.id,
                state=None if state == "all" else state,
                cursor=q.get("cursor"),
                limit=int(raw_limit),
            )
        )

    async def get_review(request: Request) -> Response:
        reviewer = await ctx.reviewer(request)
        only_query(request)
        assert reviewer.tenant is not None
        return json_response(
            await reviews.get(reviewer.tenant.id, parse_uuid(request.path_params["review_id"]))
        )

    async def claim(request: Request) -> Response:
        reviewer = await ctx.reviewer(request)
        only_query(request)
        return json_response(await reviews.claim(reviewer, parse_uuid(request.path_params["review_id"])))

    def decide(action: str) -> Any:
        async def run(request: Request) -> Response:
            reviewer = await ctx.reviewer(request)
            only_query(request)
            body = await ctx.json_body(request)
            _validate(_decision[action], body)
            review_id = parse_uuid(request.path_params["review_id"])
            fence = int(body["fence"])
            if action == "approve":
                return json_response(await reviews.approve(reviewer, review_id, fence))
            if action == "correct":
                return json_response(await reviews.correct(reviewer, review_id, fence, body["changes"]))
            return json_response(await reviews.reject(reviewer, review_id, fence, body["reason"]))

        return run

    base = "/v1/reviews"
    return [
        Route(base, list_reviews, methods=["GET"], name="list_reviews"),
        Route(f"{base}/{{review_id}}", get_review, methods=["GET"], name="get_review"),
        Route(f"{base}/{{review_id}}:claim", claim, methods=["POST"], name="claim_review"),
        *(
            Route(f"{base}/{{review_id}}:{action}", decide(action), methods=["POST"], name=f"{action}_review")
            for action in ("approve", "correct", "reject")
        ),
    ]
