"""The OpenAPI 3.1 document served at ``/openapi.json``: the services' paths and schemas (the same
schemas the server enforces), handed in by the process that mounts them, composed with the edge's
own (operator routes, health) and its security schemes."""

from __future__ import annotations

from services.common.api.openapi import ERROR_SCHEMA, ERRORS, JSON
from services.edge import ops_schemas

# What a route's ``security`` says for each kind of key.
TENANT_SECURITY: list[JSON] = [{"bearerAuth": []}]
REVIEWER_SECURITY: list[JSON] = [{"reviewerAuth": []}]
OPERATOR_SECURITY: list[JSON] = [{"operatorAuth": []}]


def _scope_errors(paths: JSON) -> None:
    """Every route that takes a key answers 403 to a valid key of another scope, and 429 to an
    address that presented too many invalid keys."""
    for item in paths.values():
        for operation in item.values():
            if operation.get("security"):
                operation["responses"].setdefault("403", ERRORS[403])
                operation["responses"].setdefault("429", ERRORS[429])


def build(components: JSON, paths: JSON) -> JSON:
    """The document: the services' ``components`` (schemas) and ``paths`` beside the edge's own."""
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
                **components,
                **ops_schemas.COMPONENTS,
            },
        },
        "paths": {
            **paths,
            **ops_schemas.paths(OPERATOR_SECURITY, ERRORS),
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
