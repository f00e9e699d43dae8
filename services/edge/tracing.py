"""The HTTP edge's server span: continues the caller's W3C trace (or starts one) per request, so a
job accepted inside it records the trace its later steps join (services/common/tracing.py)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import tracing
from services.common.tracing import SpanKind


class TraceMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"traceparent")
        if incoming is None and not tracing.enabled():
            await self.app(scope, receive, send)  # nothing to record and nothing to pass on
            return
        method = scope.get("method", "")
        status = 500

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        with tracing.span(f"{method} {scope.get('path', '')}", incoming, kind=SpanKind.SERVER) as span:
            try:
                await self.app(scope, receive, send_wrapper)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if route is not None:
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.request.method", method)
                span.set_attribute("http.response.status_code", status)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return tracing.valid(value.decode("latin-1"))
    return None
