"""``fatura run http``: the HTTP edge on uvicorn with N worker processes and a metrics port.

With more than one worker, each worker writes its metrics to a shared directory and the parent
serves them merged (prometheus-client multiprocess mode) on ``FATURA_HTTP_METRICS_PORT``.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile

import uvicorn
from prometheus_client import REGISTRY, CollectorRegistry
from uvicorn.supervisors import Multiprocess

from services.acceptance.http_api import AcceptanceSettings
from services.common import readiness
from services.common.ops_server import start_ops_server
from services.delivery.http_api import DeliverySettings

log = logging.getLogger(__name__)


def main() -> int:
    settings = AcceptanceSettings.from_env()
    # Checked before any worker starts: a worker that cannot start would be started again forever.
    DeliverySettings.from_env().require_keyring("the HTTP edge (webhook endpoint registration)")
    multiproc_dir: str | None = None
    registry: CollectorRegistry | None = None
    if settings.http_workers > 1:
        from prometheus_client import multiprocess

        multiproc_dir = tempfile.mkdtemp(prefix="fatura-http-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = multiproc_dir
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=multiproc_dir)  # type: ignore[no-untyped-call]

    ready = readiness.postgres_connect(settings.common.database_url)
    ops = start_ops_server(settings.metrics_port, ready, registry=registry or REGISTRY)
    config = uvicorn.Config(
        "services.edge.app:create_app_from_env",
        factory=True,
        host=settings.http_host,
        port=settings.http_port,
        workers=settings.http_workers,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=settings.common.log_level.lower(),
        backlog=4096,
        timeout_graceful_shutdown=10,
        server_header=False,
    )
    log.info(
        "HTTP edge on http://%s:%d with %d worker(s); metrics on :%d",
        settings.http_host,
        settings.http_port,
        settings.http_workers,
        settings.metrics_port,
    )
    try:
        if settings.http_workers > 1:
            sock = config.bind_socket()
            Multiprocess(config, sockets=[sock]).run()
        else:
            uvicorn.Server(config).run()
    finally:
        ops.shutdown()
        if multiproc_dir is not None:
            shutil.rmtree(multiproc_dir, ignore_errors=True)
    return 0
