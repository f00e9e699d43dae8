"""The `fatura` command line as an operator uses it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from fix_db import SyncPool
from fix_processes import ROOT
from services.common.api import apikeys
from services.common.procs import answers, free_port


def _fatura(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "services.cli.main", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_tenants_create_prints_the_key_once_and_stores_only_its_hash(
    base_env: dict[str, str], pool: SyncPool
) -> None:
    result = _fatura(
        "tenants",
        "create",
        "Acme Muhasebe",
        "--max-pending-jobs",
        "5",
        "--allowed-currencies",
        "try,eur",
        env=base_env,
    )

    created = json.loads(result.stdout)
    assert set(created) == {"tenant_id", "api_key"}
    with pool.connection() as conn:
        tenant = conn.execute(
            "SELECT * FROM tenants WHERE id = %s", (uuid.UUID(created["tenant_id"]),)
        ).fetchone()
        keys = conn.execute(
            "SELECT prefix, secret_hash FROM api_keys WHERE tenant_id = %s",
            (uuid.UUID(created["tenant_id"]),),
        ).fetchall()
    assert tenant is not None
    assert tenant["name"] == "Acme Muhasebe" and tenant["max_pending_jobs"] == 5
    assert tenant["allowed_currencies"] == ["TRY", "EUR"]
    assert len(keys) == 1
    assert keys[0]["secret_hash"] == apikeys.digest(created["api_key"])
    assert created["api_key"].encode() not in bytes(keys[0]["secret_hash"])


def test_tenants_create_refuses_bad_options(base_env: dict[str, str]) -> None:
    result = _fatura("tenants", "create", "x", "--allowed-currencies", "XXX", env=base_env, check=False)
    assert result.returncode == 2
    assert "unknown" in result.stdout


def test_suppliers_import_reads_csv_and_json_and_is_all_or_nothing(
    base_env: dict[str, str], pool: SyncPool, tmp_path: Path
) -> None:
    tenant_id = json.loads(_fatura("tenants", "create", "suppliers", env=base_env).stdout)["tenant_id"]
    csv_file = ROOT / "services" / "sandbox" / "samples" / "suppliers.csv"
    json_file = tmp_path / "more.json"
    json_file.write_text(
        json.dumps([{"tax_id": "111", "name": "Extra Ltd", "iban": "TR33 0006 1005 1978 6457 8413 26"}])
    )
    broken = tmp_path / "broken.csv"
    broken.write_text("tax_id,name,currency\n222,Good Ltd,TRY\n,Nameless,TRY\n333,Bad Money,XYZ\n")

    ok_csv = _fatura("suppliers", "import", str(csv_file), "--tenant", tenant_id, env=base_env)
    ok_json = _fatura("suppliers", "import", str(json_file), "--tenant", tenant_id, env=base_env)
    refused = _fatura("suppliers", "import", str(broken), "--tenant", tenant_id, env=base_env, check=False)

    sample_suppliers = len(csv_file.read_text(encoding="utf-8").splitlines()) - 1  # less the header
    assert f"imported {sample_suppliers} suppliers" in ok_csv.stdout
    assert "imported 1 suppliers" in ok_json.stdout
    assert refused.returncode == 1
    assert (
        "row 2" in refused.stderr and "row 3" in refused.stderr and "nothing was imported" in refused.stderr
    )
    with pool.connection() as conn:
        rows = conn.execute(
            "SELECT tax_id, iban FROM suppliers WHERE tenant_id = %s ORDER BY tax_id", (uuid.UUID(tenant_id),)
        ).fetchall()
    tax_ids = [r["tax_id"] for r in rows]
    assert "222" not in tax_ids and len(tax_ids) == sample_suppliers + 1
    assert {r["tax_id"]: r["iban"] for r in rows}["111"] == "TR330006100519786457841326"


def test_up_says_exactly_how_to_start_a_dependency_that_does_not_answer(base_env: dict[str, str]) -> None:
    closed = free_port()
    result = _fatura("up", env={**base_env, "FATURA_REDIS_URL": f"redis://127.0.0.1:{closed}/0"}, check=False)
    assert result.returncode == 1
    assert "Redis does not answer" in result.stderr
    assert "redis-server --daemonize yes" in result.stderr


def test_up_runs_the_stack_in_the_foreground_and_ctrl_c_stops_everything_it_started(
    base_env: dict[str, str],
) -> None:
    http_port, metrics_port, relay_port, limiter_port, limiter_metrics = (free_port() for _ in range(5))
    jobs_grpc_metrics = free_port()
    env = {
        **os.environ,
        **base_env,
        "FATURA_HTTP_PORT": str(http_port),
        "FATURA_HTTP_METRICS_PORT": str(metrics_port),
        "FATURA_HTTP_WORKERS": "1",
        "FATURA_RELAY_METRICS_PORT": str(relay_port),
        "FATURA_LIMITER_PORT": str(limiter_port),
        "FATURA_LIMITER_METRICS_PORT": str(limiter_metrics),
        "FATURA_REDIS_URL": "redis://127.0.0.1:6379/13",
        # The delivery processes' ops ports, so a stack already running here does not collide.
        "FATURA_DELIVERY_WORKER_METRICS_PORT": str(free_port()),
        "FATURA_DELIVERY_SCHEDULER_METRICS_PORT": str(free_port()),
        "FATURA_JOBS_GRPC_PORT": str(free_port()),
        "FATURA_JOBS_GRPC_METRICS_PORT": str(jobs_grpc_metrics),
    }
    up = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "up"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    urls = [
        f"http://127.0.0.1:{http_port}/readyz",
        f"http://127.0.0.1:{relay_port}/readyz",
        f"http://127.0.0.1:{limiter_metrics}/readyz",
        f"http://127.0.0.1:{jobs_grpc_metrics}/readyz",
    ]
    try:
        deadline = time.monotonic() + 60
        pending = set(urls)
        while pending and time.monotonic() < deadline and up.poll() is None:
            pending = {url for url in pending if not answers(url)}
            time.sleep(0.2)
        assert not pending, f"not ready: {pending}"

        up.send_signal(signal.SIGINT)
        output, _ = up.communicate(timeout=30)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, output
    assert "stopping" in output
    for url in urls:
        try:
            httpx.get(url, timeout=1)
            raise AssertionError(f"{url} still answers after Ctrl-C")
        except httpx.HTTPError:
            pass
