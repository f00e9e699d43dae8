"""HTTP routes of the webhook-endpoint and delivery API, mounted by the edge.

Thin: parse with the shared JSON body reader and the schemas in ``services/delivery/schemas.py``,
call one ``Endpoints`` (or ``Acks``) method, map delivery errors to the API's JSON errors (422 for
a bad endpoint or a refused target, 401 for an acknowledgement that does not verify, 404, 409). A
refused request writes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from services.common.api.body import JsonBody
from services.common.api.context import ApiContext
from services.common.api.context import only_query as _only_query
from services.common.api.errors import (
    ApiError,
    Conflict,
    NotFound,
    Unauthorized,
    Unavailable,
    Unprocessable,
)
from services.common.api.schema import RequestValidator
from services.common.ids import parse_uuid
from services.delivery import errors, schemas
from services.delivery.acks import Ack, Acks
from services.delivery.endpoints import Endpoints

_create = RequestValidator(schemas.CREATE_ENDPOINT)
_rotate = RequestValidator(schemas.ROTATE_SECRET)
_recover = RequestValidator(schemas.RECOVER)
_ack = RequestValidator(schemas.ACK)
# An acknowledgement is a few hundred bytes; its body is read whole before it is verified.
_ack_body = JsonBody(schemas.MAX_ACK_BODY_BYTES)


def _validate(validator: Any, body: Any) -> None:
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


def _mapped(error: errors.DeliveryError) -> ApiError:
    if isinstance(error, errors.NotFound):
        return NotFound(error.message)
    if isinstance(error, errors.Conflict):
        return Conflict(error.message, code=error.code)
    if isinstance(error, errors.Unauthenticated):
        return Unauthorized(error.message, code=error.code)
    if isinstance(error, errors.BadQuery):
        return ApiError(error.message, code=error.code)
    if isinstance(error, errors.SecretUnavailable):
        return Unavailable(error.message, code=error.code, headers={"Retry-After": "60"})
    return Unprocessable(error.message, code=error.code)


async def _optional_body(edge: ApiContext, request: Request) -> Any:
    """An action route's body is optional: none, or a JSON object."""
    if request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers:
        return {}
    return await edge.json_body(request)


async def _raw_ack_body(request: Request) -> bytes:
    """The exact bytes the signature covers, bounded; JSON is parsed only once they verify."""
    _ack_body.check_content_type(request.headers.get("content-type"))
    _ack_body.check_declared_length(request.headers.get("content-length"))
    chunks: list[bytes] = []
    received = 0
    async for chunk in request.stream():
        received += len(chunk)
        _ack_body.check_streamed_length(received)
        chunks.append(chunk)
    return b"".join(chunks)


def _limit(raw: str | None) -> int:
    if raw is None:
        return 100
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= 1000:
        raise ApiError("limit must be an integer from 1 to 1000", code="invalid_query")
    return int(raw)


Handler = Callable[[Request], Awaitable[Response]]


def delivery_routes(edge: ApiContext, endpoints: Endpoints) -> list[BaseRoute]:
    acks = Acks(endpoints.pool, endpoints.keyring, endpoints.settings.ack_window_seconds)

    def guarded(handler: Handler) -> Handler:
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except errors.DeliveryError as exc:
                raise _mapped(exc) from None

        return run

    async def create(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        body = await edge.json_body(request)
        _validate(_create, body)
        created = await endpoints.register(
            tenant.id, body["url"], body.get("event_types"), body.get("max_concurrency"), body.get("secret")
        )
        return JSONResponse(created, status_code=201)

    async def list_all(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        return JSONResponse({"endpoints": await endpoints.list(tenant.id)})

    async def get_one(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        endpoint_id = parse_uuid(request.path_params["endpoint_id"])
        if endpoint_id is None:
            raise NotFound("no such webhook endpoint for this tenant")
        return JSONResponse((await endpoints.list(tenant.id, endpoint_id))[0])

    def action(name: str) -> Handler:
        async def run(request: Request) -> Response:
            tenant = await edge.tenant(request)
            _only_query(request)
            endpoint_id = parse_uuid(request.path_params["endpoint_id"])
            if endpoint_id is None:
                raise NotFound("no such webhook endpoint for this tenant")
            if name == "disable":
                return JSONResponse(await endpoints.disable(tenant.id, endpoint_id))
            if name == "enable":
                return JSONResponse(await endpoints.enable(tenant.id, endpoint_id))
            if name == "rotate-secret":
                body = await _optional_body(edge, request)
                _validate(_rotate, body)
                return JSONResponse(
                    await endpoints.rotate_secret(tenant.id, endpoint_id, body.get("overlap_seconds"))
                )
            body = await edge.json_body(request)
            _validate(_recover, body)
            try:
                since = datetime.fromisoformat(body["since"].replace("Z", "+00:00"))
            except ValueError:
                raise Unprocessable("since must be an ISO-8601 date-time", code="invalid_request") from None
            if since.tzinfo is None:
                raise Unprocessable("since must carry a time zone (e.g. ...Z)", code="invalid_request")
            return JSONResponse(await endpoints.recover(tenant.id, endpoint_id, since))

        return run

    async def list_deliveries(request: Request) -> Response:
        tenant = await edge.tenant(request)
        q = request.query_params
        if "unacknowledged" in q:
            _only_query(request, "unacknowledged", "cursor", "limit")
            if q["unacknowledged"] not in ("1", "true"):
                raise ApiError("unacknowledged takes 1 (or true)", code="invalid_query")
            cursor = None
            if "cursor" in q:
                cursor = parse_uuid(q["cursor"])
                if cursor is None:
                    raise ApiError("the cursor is not one this server issued", code="invalid_cursor")
            return JSONResponse(await acks.unacknowledged(tenant.id, cursor, _limit(q.get("limit"))))
        _only_query(request, "job_id")
        job_id = parse_uuid(q.get("job_id", ""))
        if job_id is None:
            raise ApiError("job_id (a UUID) or unacknowledged=1 is required", code="invalid_query")
        return JSONResponse(await endpoints.deliveries(tenant.id, job_id))

    async def acknowledge(request: Request) -> Response:
        # Authenticated by the endpoint's signature, not by an API key: the ERP holds no key.
        _only_query(request)
        delivery_id = parse_uuid(request.path_params["delivery_id"])
        raw = await _raw_ack_body(request)
        ack_id = await acks.authenticate(delivery_id, request.headers, raw)
        assert delivery_id is not None  # authenticate found the delivery
        body = _ack_body.parse_json(raw)
        _validate(_ack, body)
        if body.get("delivery_id", str(delivery_id)).lower() != str(delivery_id):
            raise Unprocessable(
                "the signed body names another delivery than the path", code="delivery_mismatch"
            )
        ack = Ack(body["outcome"], body.get("reason"), ack_id)
        return JSONResponse(await acks.record(delivery_id, ack))

    async def resend(request: Request) -> Response:
        tenant = await edge.tenant(request)
        _only_query(request)
        delivery_id = parse_uuid(request.path_params["delivery_id"])
        if delivery_id is None:
            raise NotFound("no such delivery for this tenant")
        return JSONResponse(await endpoints.resend(tenant.id, delivery_id))

    base = "/v1/webhook-endpoints"
    routes: list[BaseRoute] = [
        Route(base, guarded(create), methods=["POST"], name="create_webhook_endpoint"),
        Route(base, guarded(list_all), methods=["GET"], name="list_webhook_endpoints"),
        Route(f"{base}/{{endpoint_id}}", guarded(get_one), methods=["GET"], name="get_webhook_endpoint"),
    ]
    for name in ("disable", "enable", "rotate-secret", "recover"):
        handler = guarded(action(name))
        routes.append(
            Route(
                f"{base}/{{endpoint_id}}:{name}", handler, methods=["POST"], name=f"{name}_webhook_endpoint"
            )
        )
    routes += [
        Route("/v1/deliveries", guarded(list_deliveries), methods=["GET"], name="list_deliveries"),
        Route(
            "/v1/deliveries/{delivery_id}:resend", guarded(resend), methods=["POST"], name="resend_delivery"
        ),
        Route(
            "/v1/deliveries/{delivery_id}:ack", guarded(acknowledge), methods=["POST"], name="ack_delivery"
        ),
    ]
    return routes
