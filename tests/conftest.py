"""Shared fixtures. Tests talk to the real PostgreSQL, RabbitMQ and Redis on this machine.

Each run gets its own database (``fatura_test_<random>``, dropped at the end) and its own
RabbitMQ queue prefix, so a test run and a running demo never see each other's data.
"""

from __future__ import annotations

import os

import pytest
from fix_ports import claim_port_range

from services.common.keyring import DEVELOPMENT_KEY

# Webhook secrets are sealed at rest: the processes tests start use the development key, like
# `fatura up`, unless a test says otherwise.
os.environ.setdefault("FATURA_SECRETS_KEY", DEVELOPMENT_KEY)

# Each pytest process (make test runs two) hands out the ports of the processes its tests start
# from a range of its own (tests/fix_ports.py).
claim_port_range(os.environ)

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
