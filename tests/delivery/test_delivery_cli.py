"""``fatura endpoints add``: the endpoint is registered, printed once with its secret, and pinged."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from fix_db import TenantHandle
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


def test_endpoints_add_prints_the_secret_once_and_the_ping_verifies_with_it(
    base_env: dict[str, str], tenant: TenantHandle, receiver: Receiver
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


def test_endpoints_add_refuses_a_private_target_and_a_bad_key(
    base_env: dict[str, str], tenant: TenantHandle
) -> None:
    refused = _fatura(
        "endpoints", "add", "https://10.0.0.1/hook", "--tenant-key", tenant.api_key, env=base_env
    )
    assert refused.returncode == 2 and "egress_refused" in refused.stderr
    unknown = _fatura("endpoints", "add", "https://10.0.0.1/hook", "--tenant-key", "fat_nope", env=base_env)
    assert unknown.returncode == 2 and "not valid" in unknown.stderr
