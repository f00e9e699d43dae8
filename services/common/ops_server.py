"""A small HTTP server on a process's metrics port: ``/metrics``, ``/healthz`` and ``/readyz``.

Used by processes that are not HTTP servers themselves (relay, workers, limiter).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, CollectorRegistry, make_wsgi_app

from services.common import readiness
from services.common.settings import env_str

_STATUS_LINES = {200: "200 OK", 503: "503 Service Unavailable"}

StartResponse = Callable[..., Any]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return


def ops_app(ready: readiness.Probe, registry: CollectorRegistry = REGISTRY) -> Callable[..., Iterable[bytes]]:
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if path == "/readyz":
            status, text = readiness.verdict(ready)
            start_response(_STATUS_LINES[status], [("Content-Type", "text/plain")])
            return [text.encode()]
        if path == "/metrics":
            result: Iterable[bytes] = metrics(environ, start_response)
            return result
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found\n"]

    return app


def ops_host(env: Mapping[str, str] | None = None) -> str:
    """Where an ops port binds unless its process names its own host: ``FATURA_METRICS_HOST``
    (loopback by default; ``0.0.0.0`` in a container, so probes and Prometheus reach it)."""
    return env_str(os.environ if env is None else env, "FATURA_METRICS_HOST", "127.0.0.1")


def start_ops_server(
    port: int, ready: readiness.Probe, *, host: str | None = None, registry: CollectorRegistry = REGISTRY
) -> WSGIServer:
    """Serve the ops endpoints on a daemon thread; ``server.shutdown()`` stops it."""
    host = ops_host() if host is None else host
    server = make_server(host, port, ops_app(ready, registry), handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name=f"ops:{port}", daemon=True).start()
    return server
