"""Shared fixtures. Tests talk to the real PostgreSQL, RabbitMQ and Redis on this machine.

Each run gets its own database (``fatura_test_<random>``, dropped at the end) and its own
RabbitMQ queue prefix, so a test run and a running demo never see each other's data.
"""

from __future__ import annotations

pytest_plugins = ["fix_db", "fix_processes", "fix_amqp", "fix_api", "fix_pipeline"]
