"""``fatura sandbox erp`` / ``fatura run erp``: serve the reference ERP receiver in the foreground."""

from __future__ import annotations

import logging

from aiohttp import web

from services.sandbox.erp.app import ERP, build_app
from services.sandbox.erp.settings import ErpSettings

log = logging.getLogger("services.sandbox.erp")


def main() -> int:
    settings = ErpSettings.from_env()
    app = build_app(settings)
    log.info(
        "reference ERP receiving webhooks at http://%s:%d/webhooks (database %s, %d secrets in force)",
        settings.host,
        settings.port,
        settings.db_path,
        app[ERP].receiver.secret_count,
    )
    # SIGTERM and Ctrl-C stop it gracefully; SIGKILL is what the crash tests use.
    web.run_app(app, host=settings.host, port=settings.port, access_log=None, print=None)
    return 0
