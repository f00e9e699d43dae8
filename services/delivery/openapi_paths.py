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
                "The deliveries of one job's events (`job_id`), or this tenant's deliveries received "
                "longer ago than the acknowledgement window and not acknowledged by the ERP "
                "(`unacknowledged=1`, oldest first, paged by `cursor`), with every attempt. Exactly "
                "one of `job_id` and `unacknowledged` is given.",
                security,
                ("200", "The deliveries.", "DeliveryList"),
                errors,
                (400, 401, 503),
                params=[
                    _query("job_id", {"type": "string", "pattern": UUID_PATTERN}),
                    _query("unacknowledged", {"type": "string", "enum": ["1", "true"]}),
                    _query("cursor", {"type": "string", "pattern": UUID_PATTERN}),
                    _query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}),
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
        "/v1/deliveries/{delivery_id}:ack": {"post": _ack(errors)},
    }


def _query(name: str, schema: JSON) -> JSON:
    return {"name": name, "in": "query", "required": False, "schema": schema}


def _header(name: str, description: str, schema: JSON) -> JSON:
    return {"name": name, "in": "header", "required": True, "description": description, "schema": schema}


def _ack(errors: Mapping[int, JSON]) -> JSON:
    """Signed by the endpoint's secret (Standard Webhooks v1), not by an API key."""
    operation = _op(
        "acknowledgeDelivery",
        "The ERP's business outcome of a delivery it received: posted, or rejected with a reason "
        "(which opens a review task). Not authenticated by an API key but by a Standard Webhooks "
        "signature made with a secret in force of the delivery's endpoint over "
        "`webhook-id.webhook-timestamp.body` (fatura_sdk.acknowledge makes it). The same outcome "
        "again is a 200 that changes nothing; another outcome after one was recorded is 409 "
        "`ack_conflict`; a delivery not yet recorded as delivered is 409 "
        "`delivery_not_delivered` (ask again shortly); only extraction.completed.v1 deliveries are "
        "acknowledged (409 `not_acknowledgeable`).",
        [],
        ("200", "The delivery, with its `ack`.", "Delivery"),
        errors,
        (400, 401, 404, 409, 413, 415, 422, 503),
        params=[
            _param("delivery_id"),
            _header(
                "webhook-id",
                "A fresh id of this acknowledgement, chosen by the ERP.",
                {"type": "string", "minLength": 1, "maxLength": 256},
            ),
            _header(
                "webhook-timestamp",
                "Unix seconds; within 5 minutes of the server's clock.",
                {"type": "string", "pattern": "^[0-9]{1,12}$"},
            ),
            _header(
                "webhook-signature",
                "`v1,<base64 HMAC-SHA256>`, one entry per secret (space-separated).",
                {"type": "string", "minLength": 1},
            ),
        ],
        body=("AcknowledgeDelivery", True),
    )
    operation["responses"]["401"] = {
        **errors[401],
        "description": "The signature is missing, malformed, out of its time window, or made with no "
        "secret in force of the delivery's endpoint. Nothing was changed.",
    }
    return operation
