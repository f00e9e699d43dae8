"""The OpenAPI 3.1 document served at ``/openapi.json``, built from the schemas the server enforces."""

from __future__ import annotations

from typing import Any

from services.acceptance import ops_schemas, schemas
from services.acceptance.idempotency import MAX_KEY_LENGTH
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.delivery import openapi_paths as delivery_openapi

JSON = dict[str, Any]


def _json(schema_ref: str) -> JSON:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}


def _error(description: str, *, retry_after: bool = False, challenge: bool = False) -> JSON:
    response: JSON = {"description": description, "content": _json("Error")}
    headers: JSON = {}
    if retry_after:
        headers["Retry-After"] = {
            "description": "Seconds to wait before retrying.",
            "required": True,
            "schema": {"type": "string", "pattern": "^[0-9]+$"},
        }
    if challenge:
        headers["WWW-Authenticate"] = {"schema": {"type": "string"}}
    if headers:
        response["headers"] = headers
    return response


_E400 = _error("Malformed request: bad JSON, a bad header, or a bad query parameter. Nothing was changed.")
_E401 = _error("Missing or invalid API key.", challenge=True)
_E403 = _error("A valid API key of another scope: this route takes a tenant's key, or an operator's key.")
_E404 = _error("No such resource for this tenant.")
_E409 = _error("Conflicts with an existing job; the body names it.")
_E413 = _error("The body or the document is larger than allowed. Nothing was written.")
_E415 = _error("The body must be application/json. Nothing was written.")
_E422 = _error("The JSON does not match the schema. Nothing was written.")
_E429 = _error("A tenant quota would be exceeded. Nothing was written.", retry_after=True)
_E503 = _error("The system cannot take this request now. Nothing was written.", retry_after=True)


def _scope_errors(paths: JSON) -> None:
    """Every route that takes a key answers 403 to a valid key of another scope."""
    for item in paths.values():
        for operation in item.values():
            if operation.get("security"):
                operation["responses"].setdefault("403", _E403)


def build(settings: AcceptanceSettings) -> JSON:
    security: list[JSON] = [{"bearerAuth": []}]
    operator_security: list[JSON] = [{"operatorAuth": []}]
    job_id_param = {
        "name": "job_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": schemas.UUID_PATTERN},
    }
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
                "operatorAuth": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An operator's key (fatura keys create --operator): /v1/ops only.",
                },
            },
            "schemas": {
                "Error": schemas.ERROR,
                "Document": schemas.DOCUMENT,
                "JobAccepted": schemas.JOB_ACCEPTED,
                "JobStatus": schemas.JOB_STATUS,
                "JobSummary": schemas.JOB_SUMMARY,
                "JobList": schemas.JOB_LIST,
                "CreateDocument": schemas.create_document_request(),
                "CreateJob": schemas.create_job_request((settings.model_policy,)),
                **delivery_openapi.COMPONENTS,
                **ops_schemas.COMPONENTS,
            },
        },
        "paths": {
            "/v1/documents": {
                "post": {
                    "operationId": "createDocument",
                    "summary": "Store a document (or a new version of one). Documents are immutable.",
                    "security": security,
                    "requestBody": {"required": True, "content": _json("CreateDocument")},
                    "responses": {
                        "201": {"description": "Stored.", "content": _json("Document")},
                        "400": _E400,
                        "401": _E401,
                        "404": _E404,
                        "413": _E413,
                        "415": _E415,
                        "422": _E422,
                        "503": _E503,
                    },
                }
            },
            "/v1/extraction-jobs": {
                "post": {
                    "operationId": "createExtractionJob",
                    "summary": "Start an extraction job. Answers 202: it has started and is NOT complete.",
                    "security": security,
                    "parameters": [
                        {
                            "name": "Idempotency-Key",
                            "in": "header",
                            "required": True,
                            "description": "Tenant-scoped; the same key and body return the same job.",
                            "schema": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": MAX_KEY_LENGTH,
                                "pattern": "^[\\x21-\\x7e]+$",
                            },
                        }
                    ],
                    "requestBody": {"required": True, "content": _json("CreateJob")},
                    "responses": {
                        "202": {
                            "description": "Accepted durably; NOT complete. Poll status_url.",
                            "headers": {"Location": {"required": True, "schema": {"type": "string"}}},
                            "content": _json("JobAccepted"),
                        },
                        "400": _E400,
                        "401": _E401,
                        "409": _E409,
                        "413": _E413,
                        "415": _E415,
                        "422": _E422,
                        "429": _E429,
                        "503": _E503,
                    },
                },
                "get": {
                    "operationId": "listExtractionJobs",
                    "summary": "List this tenant's jobs, newest first.",
                    "security": security,
                    "parameters": [
                        {
                            "name": "state",
                            "in": "query",
                            "schema": {"type": "string", "enum": sorted(states.ALL)},
                        },
                        {"name": "cursor", "in": "query", "schema": {"type": "string", "maxLength": 512}},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": schemas.MAX_LIST_LIMIT},
                        },
                    ],
                    "responses": {
                        "200": {"description": "A page of jobs.", "content": _json("JobList")},
                        "400": _E400,
                        "401": _E401,
                        "503": _E503,
                    },
                },
            },
            "/v1/extraction-jobs/{job_id}": {
                "get": {
                    "operationId": "getExtractionJob",
                    "summary": "The authoritative status of one job; `done` tells whether it has finished.",
                    "security": security,
                    "parameters": [job_id_param],
                    "responses": {
                        "200": {"description": "The job.", "content": _json("JobStatus")},
                        "400": _E400,
                        "401": _E401,
                        "404": _E404,
                        "503": _E503,
                    },
                }
            },
            "/v1/extraction-jobs/{job_id}:cancel": {
                "post": {
                    "operationId": "cancelExtractionJob",
                    "summary": "Cancel a job that has not finished. Cancelling a cancelled job is a no-op.",
                    "security": security,
                    "parameters": [job_id_param],
                    "responses": {
                        "200": {"description": "The job, now CANCELLED.", "content": _json("JobStatus")},
                        "400": _E400,
                        "401": _E401,
                        "404": _E404,
                        "409": _E409,
                        "503": _E503,
                    },
                }
            },
            **delivery_openapi.paths(
                security, {400: _E400, 401: _E401, 404: _E404, 409: _E409, 415: _E415, 422: _E422, 503: _E503}
            ),
            **ops_schemas.paths(
                operator_security,
                {
                    400: _E400,
                    401: _E401,
                    403: _E403,
                    404: _E404,
                    413: _E413,
                    415: _E415,
                    422: _E422,
                    503: _E503,
                },
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
