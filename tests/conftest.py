"""Shared fixtures. Tests talk to the real PostgreSQL, RabbitMQ and Redis on this machine.

Each run gets its own database (``fatura_test_<random>``, dropped at the end) and its own
RabbitMQ queue prefix, so a test run and a running demo never see each other's data.
"""

from __future__ import annotations

import os

from services.common.keyring import DEVELOPMENT_KEY

# Webhook secrets are sealed at rest: the processes tests start use the development key, like
# `fatura up`, unless a test says otherwise.
os.environ.setdefault("FATURA_SECRETS_KEY", DEVELOPMENT_KEY)

pytest_plugins = ["fix_db", "fix_processes", "fix_amqp", "fix_api", "fix_pipeline"]
