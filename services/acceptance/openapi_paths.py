"""The acceptance service's part of ``/openapi.json``: documents, extraction jobs and batches, built
from the same JSON Schemas the server validates requests with."""

from __future__ import annotations

from services.acceptance import schemas
from services.acceptance.batches import openapi as batch_openapi
from services.acceptance.idempotency import MAX_KEY_LENGTH
from services.acceptance.settings import AcceptanceSettings
from services.common import states
from services.common.api.openapi import ERRORS, JSON, content


def components(settings: AcceptanceSettings) -> JSON:
    return {
        "Document": schemas.DOCUMENT,
        "JobAccepted": schemas.JOB_ACCEPTED,
        "JobStatus": schemas.JOB_STATUS,
        "JobSummary": schemas.JOB_SUMMARY,
        "JobList": schemas.JOB_LIST,
        "CreateDocument": schemas.create_document_request(),
        "CreateJob": schemas.create_job_request((settings.model_policy,)),
        **batch_openapi.components(settings),
    }


def paths(security: list[JSON]) -> JSON:
    job_id_param = {
        "name": "job_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string", "pattern": schemas.UUID_PATTERN},
    }
    return {
        "/v1/documents": {
            "post": {
                "operationId": "createDocument",
                "summary": "Store a document (or a new version of one). Documents are immutable.",
                "security": security,
                "requestBody": {"required": True, "content": content("CreateDocument")},
                "responses": {
                    "201": {"description": "Stored.", "content": content("Document")},
                    "400": ERRORS[400],
                    "401": ERRORS[401],
                    "404": ERRORS[404],
                    "413": ERRORS[413],
                    "415": ERRORS[415],
                    "422": ERRORS[422],
                    "503": ERRORS[503],
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
                "requestBody": {"required": True, "content": content("CreateJob")},
                "responses": {
                    "202": {
                        "description": "Accepted durably; NOT complete. Poll status_url.",
                        "headers": {"Location": {"required": True, "schema": {"type": "string"}}},
                        "content": content("JobAccepted"),
                    },
                    "400": ERRORS[400],
                    "401": ERRORS[401],
                    "409": ERRORS[409],
                    "413": ERRORS[413],
                    "415": ERRORS[415],
                    "422": ERRORS[422],
                    "429": ERRORS[429],
                    "503": ERRORS[503],
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
                    "200": {"description": "A page of jobs.", "content": content("JobList")},
                    "400": ERRORS[400],
                    "401": ERRORS[401],
                    "503": ERRORS[503],
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
                    "200": {"description": "The job.", "content": content("JobStatus")},
                    "400": ERRORS[400],
                    "401": ERRORS[401],
                    "404": ERRORS[404],
                    "503": ERRORS[503],
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
                    "200": {"description": "The job, now CANCELLED.", "content": content("JobStatus")},
                    "400": ERRORS[400],
                    "401": ERRORS[401],
                    "404": ERRORS[404],
                    "409": ERRORS[409],
                    "503": ERRORS[503],
                },
            }
        },
        **batch_openapi.paths(security),
    }
