"""The batch routes' part of ``/openapi.json``, built from the schemas the server validates with."""

from __future__ import annotations

from services.acceptance.batches import schemas
from services.acceptance.batches.views import ERRORS as ERRORS_FILTER
from services.acceptance.idempotency import MAX_KEY_LENGTH
from services.acceptance.schemas import UUID_PATTERN
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.common.api.openapi import ERRORS, JSON, content


def components(settings: AcceptanceSettings) -> JSON:
    return {
        "CreateBatch": schemas.create_batch_request((settings.model_policy,), settings.max_batch_items),
        "BatchAccepted": schemas.BATCH_ACCEPTED,
        "BatchStatus": schemas.BATCH_STATUS,
        "BatchItem": schemas.BATCH_ITEM,
        "BatchItems": schemas.BATCH_ITEMS,
    }


def paths(security: list[JSON]) -> JSON:
    batch_id = {
        "name": "batch_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": UUID_PATTERN},
    }
    return {
        "/v1/extraction-batches": {
            "post": {
                "operationId": "createExtractionBatch",
                "summary": (
                    "Start many extraction jobs as one batch, every item or none. Answers 202: the batch "
                    "has STARTED and is NOT complete."
                ),
                "security": security,
                "parameters": [
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": True,
                        "description": (
                            "Tenant-scoped; the same key and body return the same batch. An item without "
                            "its own key gets this key, a space, `#` and its index."
                        ),
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_KEY_LENGTH,
                            "pattern": "^[\\x21-\\x7e]+$",
                        },
                    }
                ],
                "requestBody": {"required": True, "content": content("CreateBatch")},
                "responses": {
                    "202": {
                        "description": "Every item accepted durably; NOT complete. Poll status_url.",
                        "headers": {"Location": {"required": True, "schema": {"type": "string"}}},
                        "content": content("BatchAccepted"),
                    },
                    **{str(code): ERRORS[code] for code in (400, 401, 409, 413, 415, 422, 429, 503)},
                },
            }
        },
        "/v1/extraction-batches/{batch_id}": {
            "get": {
                "operationId": "getExtractionBatch",
                "summary": "A batch's counts and state; `done` tells whether every item has finished.",
                "security": security,
                "parameters": [batch_id],
                "responses": {
                    "200": {"description": "The batch.", "content": content("BatchStatus")},
                    **{str(code): ERRORS[code] for code in (400, 401, 404, 503)},
                },
            }
        },
        "/v1/extraction-batches/{batch_id}/items": {
            "get": {
                "operationId": "listExtractionBatchItems",
                "summary": "The batch's items in order, with each result or error; readable while it runs.",
                "security": security,
                "parameters": [
                    batch_id,
                    {
                        "name": "state",
                        "in": "query",
                        "description": (
                            f"a job state, or `{ERRORS_FILTER}`: every item that ended without a result"
                        ),
                        "schema": {"type": "string", "enum": [*sorted(states.ALL), ERRORS_FILTER]},
                    },
                    {"name": "cursor", "in": "query", "schema": {"type": "string", "maxLength": 512}},
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": schemas.MAX_ITEMS_LIMIT},
                    },
                ],
                "responses": {
                    "200": {"description": "A page of items.", "content": content("BatchItems")},
                    **{str(code): ERRORS[code] for code in (400, 401, 404, 503)},
                },
            }
        },
    }
