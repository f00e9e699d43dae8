"""The OpenAPI 3.1 document served at ``/openapi.json``: each service's paths and schemas (the same
schemas the server enforces), composed with the edge's own (operator routes, health)."""

from __future__ import annotations

from services.acceptance.http_api import AcceptanceSettings, events_openapi
from services.acceptance.http_api import openapi_paths as acceptance_openapi
from services.common.api.openapi import ERROR_SCHEMA, ERRORS, JSON
from services.delivery.http_api import openapi_paths as delivery_openapi
from services.edge import ops_schemas
from services.inference.http_api import review_schemas


def _scope_errors(paths: JSON) -> None:
    """Every route that takes a key answers 403 to a valid key of another scope, and 429 to an
    address that presented too many invalid keys."""
    for item in paths.values():
        for operation in item.values():
            if operation.get("security"):
                operation["responses"].setdefault("403", ERRORS[403])
                operation["responses"].setdefault("429", ERRORS[429])


def build(settings: AcceptanceSettings) -> JSON:
    security: list[JSON] = [{"bearerAuth": []}]
    operator_security: list[JSON] = [{"operatorAuth": []}]
    document: JSON = {
        "openapi": "3.1.0",
        "info": {
            "title": "Fatura",
            "version": "1",
            "description": (
                "Submit invoice documents for LLM extraction. A submission is accepted durably and "
                "answered 202 at once: the job has STARTED and is NOT complete. Poll its status_url "
                "(after poll_after_seconds) until `done` is true."
            ),
        },
        "components": {
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer", "description": "A tenant's API key."},
                "reviewerAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A reviewer's key (fatura keys create --tenant ID --scope reviewer): "
                    "/v1/reviews only, for that tenant.",
                },
                "operatorAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An operator's key (fatura keys create --operator): /v1/ops only.",
                },
            },
            "schemas": {
                "Error": ERROR_SCHEMA,
                **acceptance_openapi.components(settings),
                **events_openapi.COMPONENTS,
                **delivery_openapi.COMPONENTS,
                **ops_schemas.COMPONENTS,
                **review_schemas.COMPONENTS,
            },
        },
        "paths": {
            **acceptance_openapi.paths(security),
            **events_openapi.paths(security),
            **delivery_openapi.paths(security, ERRORS),
            **review_schemas.paths([{"reviewerAuth": []}], ERRORS),
            **ops_schemas.paths(
                operator_security,
                ERRORS,
            ),
            "/healthz": {
                "get": {
                    "operationId": "healthz",
                    "summary": "The process is alive.",
                    "security": [],
                    "responses": {"200": {"description": "Alive.", "content": {"text/plain": {}}}},
                }
            },
            "/readyz": {
                "get": {
                    "operationId": "readyz",
                    "summary": "The process and its database answer.",
                    "security": [],
                    "responses": {
                        "200": {"description": "Ready.", "content": {"text/plain": {}}},
                        "503": {"description": "Not ready.", "content": {"text/plain": {}}},
                    },
                }
            },
        },
    }
    _scope_errors(document["paths"])
    return document
