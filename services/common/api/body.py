"""Reading a request's JSON body for any route: media type, size (declared and streamed) and JSON
that Python would accept but JSON does not (NaN, Infinity), each refused with a typed error
before a byte reaches a service."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from services.common.api.errors import ApiError, PayloadTooLarge, UnsupportedMediaType


class JsonBody:
    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes

    async def read(self, request: Request) -> Any:
        """The parsed body of ``request``, read no further than the size limit."""
        self.check_content_type(request.headers.get("content-type"))
        self.check_declared_length(request.headers.get("content-length"))
        chunks: list[bytes] = []
        received = 0
        async for chunk in request.stream():
            received += len(chunk)
            self.check_streamed_length(received)
            chunks.append(chunk)
        return self.parse_json(b"".join(chunks))

    def check_content_type(self, content_type: str | None) -> None:
        media_type = (content_type or "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            raise UnsupportedMediaType(
                f"the body must be sent as application/json, not {media_type or 'without a Content-Type'}"
            )

    def check_declared_length(self, content_length: str | None) -> None:
        if content_length is None:
            return
        try:
            declared = int(content_length)
        except ValueError:
            raise ApiError("the Content-Length header is not a number", code="bad_content_length") from None
        if declared > self.max_body_bytes:
            raise self._too_large()

    def check_streamed_length(self, received: int) -> None:
        if received > self.max_body_bytes:
            raise self._too_large()

    def parse_json(self, raw: bytes) -> Any:
        if not raw:
            raise ApiError("the request body is empty; send a JSON object", code="malformed_json")
        try:
            return _loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ApiError(f"the request body is not valid JSON: {exc}", code="malformed_json") from None

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(
            f"the request body is larger than {self.max_body_bytes} bytes",
            code="body_too_large",
            details={"max_bytes": self.max_body_bytes},
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


# ``json.loads(raw, parse_constant=...)`` builds a new decoder at every call, half the cost of
# parsing a job's body; ``_loads`` is that call with the decoder built once: the same decoding of the
# bytes, the same decoder, the same values and errors (and one frame, as ``json.loads``, so a deeply
# nested body meets the recursion limit where it did).
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _loads(raw: bytes) -> Any:
    return _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
