"""``fatura endpoints add``: the endpoint is registered, printed once with its secret, and its
verification ping is queued for the delivery service."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fix_db import SyncPool, TenantHandle
from fix_delivery import Receiver
from fix_processes import ROOT


def _fatura(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_endpoints_add_prints_the_secret_once_and_queues_the_verification_ping(
    base_env: dict[str, str], tenant: TenantHandle, receiver: Receiver, pool: SyncPool
) -> None:
    env = {**base_env, "FATURA_EGRESS_ALLOW": "127.0.0.0/8"}
    result = _fatura(
        "endpoints",
        "add",
        receiver.url,
        "--tenant-key",
        tenant.api_key,
        "--events",
        "extraction.failed.v1",
        env=env,
    )
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["event_types"] == ["extraction.failed.v1"]
    assert printed["secret"].startswith("whsec_")
    # The CLI calls nothing: the ping is queued for the delivery service, which sends it signed.
    assert printed["verified"] is False and printed["verification"]["state"] == "pending"
    assert receiver.received == []
    with pool.connection() as conn:
        ping = conn.execute(
            "SELECT state, event_type, job_id FROM deliveries WHERE delivery_id = %s",
            (printed["verification"]["delivery_id"],),
        ).fetchone()
        # The receiver goes away with this test: its endpoint is disabled, as a tenant would, so
        # the ping's retries never reach a later test's delivery worker.
        conn.execute(
            "UPDATE webhook_endpoints SET state = 'disabled', disabled_reason = 'test over' WHERE id = %s",
            (printed["endpoint_id"],),
        )
    assert ping == {"state": "pending", "event_type": "webhook.ping.v1", "job_id": None}


def test_endpoints_add_refuses_a_private_target_and_a_bad_key(
    base_env: dict[str, str], tenant: TenantHandle
) -> None:
    refused = _fatura(
        "endpoints", "add", "https://10.0.0.1/hook", "--tenant-key", tenant.api_key, env=base_env
    )
    assert refused.returncode == 2 and "egress_refused" in refused.stderr
    unknown = _fatura("endpoints", "add", "https://10.0.0.1/hook", "--tenant-key", "fat_nope", env=base_env)
    assert unknown.returncode == 2 and "not valid" in unknown.stderr
