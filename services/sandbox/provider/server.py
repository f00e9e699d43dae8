"""``fatura sandbox provider`` / ``fatura run provider``: the simulated LLM provider on uvicorn."""

from __future__ import annotations

import logging

import uvicorn

from services.sandbox.provider.app import create_app
from services.sandbox.provider.settings import ProviderSettings

log = logging.getLogger(__name__)


def main() -> int:
    settings = ProviderSettings.from_env()
    limits = ", ".join(
        f"{name} {value or 'unlimited'}"
        for name, value in (
            ("RPM", settings.rpm),
            ("TPM", settings.tpm),
            ("concurrency", settings.concurrency),
        )
    )
    log.info(
        "simulated provider on http://%s:%d (models %s; %s; latency %s ms %s)",
        settings.host,
        settings.port,
        ", ".join(settings.models),
        limits,
        f"{settings.latency_ms:g}",
        settings.latency_distribution,
    )
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level=settings.log_level.lower(),
        backlog=4096,
        # hanging requests (the hang fault) must not hold a Ctrl-C for long
        timeout_graceful_shutdown=2,
        server_header=False,
    )
    uvicorn.Server(config).run()
    return 0
