"""The server side of the shared token: a grpc.aio interceptor that answers UNAUTHENTICATED, before
the servicer runs, to any call without ``authorization: Bearer <FATURA_LIMITER_TOKEN>``.

The standard health service stays open (platform probes carry no token) and reflection follows its
own switch (FATURA_LIMITER_REFLECTION); every other method, including any added later, needs the token.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.limiter import metrics
from services.limiter.security import token_matches

log = logging.getLogger(__name__)

# Method-path prefixes answered without a token.
OPEN_SERVICES = (
    "/grpc.health.v1.Health/",
    "/grpc.reflection.v1alpha.ServerReflection/",
    "/grpc.reflection.v1.ServerReflection/",
)
REFUSAL = "missing or wrong bearer token (FATURA_LIMITER_TOKEN)"


def _refusing(handler: Any, method: str) -> Any:
    """A handler of the same shape as ``handler`` that answers UNAUTHENTICATED. It never calls the
    servicer and never parses the request: nothing changes."""

    async def refuse(_request: Any, context: Any) -> None:
        metrics.UNAUTHENTICATED.labels(method).inc()
        log.warning("refused %s from %s: %s", method, context.peer(), REFUSAL)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSAL)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)


class TokenInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no type hints
    def __init__(self, token: str) -> None:
        self._token = token

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or method.startswith(OPEN_SERVICES):
            return handler  # an unknown method answers UNIMPLEMENTED with or without a token
        if token_matches(handler_call_details.invocation_metadata, self._token):
            return handler
        return _refusing(handler, method.rsplit("/", 1)[-1])
