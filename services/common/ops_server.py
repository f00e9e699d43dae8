"""A small HTTP server on a process's metrics port: ``/metrics``, ``/healthz`` and ``/readyz``.

Used by processes that are not HTTP servers themselves (relay, workers, limiter).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

ReadyCheck = Callable[[], str | None]
"""Returns None when ready, or a short reason why not."""

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def ops_app(ready: ReadyCheck, registry: CollectorRegistry = REGISTRY) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            try:
                problem = ready()
            except Exception as exc:  # a failing check means "not ready", never a crash
                problem = f"{type(exc).__name__}: {exc}"
            if problem is None:
                start_response("200 OK", [("Content-Type", "text/plain")])
                return [b"ready\n"]
            start_response("503 Service Unavailable", [("Content-Type", "text/plain")])
            return [f"not ready: {problem}\n".encode()]
        if path == "/metrics":
            result: Iterable[bytes] = metrics(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    return app


def start_ops_server(
    port: int, ready: ReadyCheck, *, host: str = "127.0.0.1", registry: CollectorRegistry = REGISTRY
) -> WSGIServer:
    """Serve the ops endpoints on a daemon thread; ``server.shutdown()`` stops it."""
    server = make_server(host, port, ops_app(ready, registry), handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name=f"ops:{port}", daemon=True).start()
    return server
