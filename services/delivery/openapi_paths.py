"""The webhook-endpoint and delivery routes as OpenAPI 3.1 path items, for ``/openapi.json``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.delivery.schemas import COMPONENTS, UUID_PATTERN

JSON = dict[str, Any]

__all__ = ["COMPONENTS", "paths"]


def _json(ref: str) -> JSON:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}}


def _param(name: str) -> JSON:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": UUID_PATTERN},
    }


def _op(
    op_id: str,
    summary: str,
    security: list[JSON],
    ok: tuple[str, str, str],
    errors: Mapping[int, JSON],
    codes: tuple[int, ...],
    *,
    params: list[JSON] | None = None,
    body: tuple[str, bool] | None = None,
) -> JSON:
    status, description, ref = ok
    operation: JSON = {
        "operationId": op_id,
        "summary": summary,
        "security": security,
        "responses": {status: {"description": description, "content": _json(ref)}}
        | {str(c): errors[c] for c in codes},
    }
    if params:
        operation["parameters"] = params
    if body is not None:
        operation["requestBody"] = {"required": body[1], "content": _json(body[0])}
    return operation


def paths(security: list[JSON], errors: Mapping[int, JSON]) -> JSON:
    """``errors`` maps a status code to the edge's shared error response object."""
    endpoint = [_param("endpoint_id")]
    std = (400, 401, 404, 503)
    return {
        "/v1/webhook-endpoints": {
            "post": _op(
                "createWebhookEndpoint",
                "Register a webhook endpoint; the secret is shown only in this answer. The delivery "
                "service sends it a signed webhook.ping.v1 right after; `verified` becomes true when "
                "the ping (or any delivery) is answered 2xx.",
                security,
                ("201", "Registered.", "WebhookEndpointCreated"),
                errors,
                (400, 401, 409, 415, 422, 503),
                body=("CreateWebhookEndpoint", True),
            ),
            "get": _op(
                "listWebhookEndpoints",
                "This tenant's webhook endpoints (secrets are never shown again, only their key ids).",
                security,
                ("200", "The endpoints.", "WebhookEndpointList"),
                errors,
                (400, 401, 503),
            ),
        },
        "/v1/webhook-endpoints/{endpoint_id}": {
            "get": _op(
                "getWebhookEndpoint",
                "One webhook endpoint: its state and whether it is verified.",
                security,
                ("200", "The endpoint.", "WebhookEndpoint"),
                errors,
                std,
                params=endpoint,
            ),
        },
        "/v1/webhook-endpoints/{endpoint_id}:disable": {
            "post": _op(
                "disableWebhookEndpoint",
                "Stop delivering to this endpoint; events that arrive meanwhile wait as failed deliveries.",
                security,
                ("200", "The endpoint, disabled.", "WebhookEndpoint"),
                errors,
                std,
                params=endpoint,
            )
        },
        "/v1/webhook-endpoints/{endpoint_id}:enable": {
            "post": _op(
                "enableWebhookEndpoint",
                "Deliver to this endpoint again; clears its failure counters and circuit breaker.",
                security,
                ("200", "The endpoint, enabled.", "WebhookEndpoint"),
                errors,
                std,
                params=endpoint,
            )
        },
        "/v1/webhook-endpoints/{endpoint_id}:rotate-secret": {
            "post": _op(
                "rotateWebhookSecret",
                "A new secret; the old one keeps signing beside it for the overlap window.",
                security,
                ("200", "The new secret, shown only here.", "WebhookSecretRotated"),
                errors,
                (400, 401, 404, 415, 422, 503),
                params=endpoint,
                body=("RotateWebhookSecret", False),
            )
        },
        "/v1/webhook-endpoints/{endpoint_id}:recover": {
            "post": _op(
                "recoverWebhookEndpoint",
                "Send again every failed or dead delivery to this endpoint created since `since`.",
                security,
                ("200", "How many deliveries were queued again.", "WebhookEndpointRecovered"),
                errors,
                (400, 401, 404, 409, 415, 422, 503),
                params=endpoint,
                body=("RecoverWebhookEndpoint", True),
            )
        },
        "/v1/deliveries": {
            "get": _op(
                "listDeliveries",
                "The deliveries of one job's events, with every attempt.",
                security,
                ("200", "The deliveries.", "DeliveryList"),
                errors,
                (400, 401, 503),
                params=[
                    {
                        "name": "job_id",
                        "in": "query",
                        "required": True,
                        "schema": {"type": "string", "pattern": UUID_PATTERN},
                    }
                ],
            )
        },
        "/v1/deliveries/{delivery_id}:resend": {
            "post": _op(
                "resendDelivery",
                "Send a finished delivery again, with the same webhook-id (receivers dedup it).",
                security,
                ("200", "The delivery, pending again.", "Delivery"),
                errors,
                (400, 401, 404, 409, 503),
                params=[_param("delivery_id")],
            )
        },
    }
