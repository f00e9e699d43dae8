"""OpenAPI 3.1 pieces every service's part of ``/openapi.json`` uses: the error body and the error
responses, so each service describes its paths with the same words."""

from __future__ import annotations

from typing import Any

JSON = dict[str, Any]

ERROR_SCHEMA: JSON = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}


def content(schema_ref: str) -> JSON:
    """A JSON body of ``#/components/schemas/<schema_ref>``."""
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}


def error_response(description: str, *, retry_after: bool = False, challenge: bool = False) -> JSON:
    response: JSON = {"description": description, "content": content("Error")}
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


ERRORS: dict[int, JSON] = {
    400: error_response(
        "Malformed request: bad JSON, a bad header, or a bad query parameter. Nothing was changed."
    ),
    401: error_response("Missing or invalid API key.", challenge=True),
    403: error_response(
        "A valid API key of another scope: this route takes a tenant's key, or an operator's key."
    ),
    404: error_response("No such resource for this tenant."),
    409: error_response("Conflicts with an existing resource; the body names it."),
    413: error_response("The body or the document is larger than allowed. Nothing was written."),
    415: error_response("The body must be application/json. Nothing was written."),
    422: error_response("The JSON does not match the schema. Nothing was written."),
    429: error_response(
        "A tenant quota would be exceeded, or too many invalid keys came from this address. Nothing was "
        "written.",
        retry_after=True,
    ),
    503: error_response("The system cannot take this request now. Nothing was written.", retry_after=True),
}


def responses(ok: JSON, *codes: int) -> JSON:
    """An operation's responses: its success (``{status: response}``) and the listed error codes."""
    return {**ok, **{str(code): ERRORS[code] for code in codes}}
