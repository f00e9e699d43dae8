"""Shared fixtures. Tests talk to the real PostgreSQL, RabbitMQ and Redis on this machine.

Each run gets its own database (``fatura_test_<random>``, dropped at the end) and its own
RabbitMQ queue prefix, so a test run and a running demo never see each other's data.
"""

from __future__ import annotations

import os

import pytest

from services.common.keyring import DEVELOPMENT_KEY

# Webhook secrets are sealed at rest: the processes tests start use the development key, like
# `fatura up`, unless a test says otherwise.
os.environ.setdefault("FATURA_SECRETS_KEY", DEVELOPMENT_KEY)

# Each pytest process (make test runs two) hands out the ports of the processes its tests start
# from a range of its own, below the kernel's ephemeral ports (32768 and up): a port the kernel
# picks can be picked again by the other process, or taken by an outgoing connection, before its
# server binds it (seen once: a chaos run's edge found its port held by another test's server).
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0) % 6
os.environ.setdefault("FATURA_PORT_RANGE", f"{20000 + 2000 * _WORKER}-{21999 + 2000 * _WORKER}")

pytest_plugins = ["fix_db", "fix_processes", "fix_amqp", "fix_api", "fix_pipeline"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each schemathesis operation its own node id.

    pytest 9.2 builds a test's node id from its ``originalname`` and parameters, and schemathesis
    4.32 gives every operation's test the bare function name there: the operations of
    tests/integration/test_openapi_contract.py would all share one id. pytest-xdist hands out tests
    by id, so it would run one of them; with the operation as the id's parameter it runs each.
    """
    for item in items:
        label = getattr(item, "operation_label", None)
        node_id = getattr(item, "_id", None)
        if label and node_id is not None and node_id.params is None:
            item._id = node_id.with_params(label)
