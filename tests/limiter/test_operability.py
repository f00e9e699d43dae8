"""What operators and platforms see: gRPC health and reflection, Prometheus metrics, SIGHUP reload,
and ``fatura run limiter`` stopping cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.procs import free_port
from services.limiter.model import Denial, DenyReason, Grant, Outcome
from tests.limiter.conftest import ROOT, SHARED_REDIS_URL

if TYPE_CHECKING:
    from tests.limiter.conftest import LimiterProcess, StartLimiter

CONFIG = """
[pools.p]
pacing = "window"
rpm = 1000
tpm = 1000000
max_in_flight = 3
"""


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric line starting with {line_start!r}")


def test_health_and_reflection_name_the_limiter_service(shared_limiter: LimiterProcess) -> None:
    assert shared_limiter.health("fatura.limiter.v1.LimiterService") == health_pb2.HealthCheckResponse.SERVING
    with grpc.insecure_channel(shared_limiter.address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        responses = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")])
        )
        names = {s.name for s in next(iter(responses)).list_services_response.service}
    assert {"fatura.limiter.v1.LimiterService", "grpc.health.v1.Health"} <= names


def test_metrics_show_grants_denials_held_permits_cooldowns_and_latency(start_limiter: StartLimiter) -> None:
    """Given permits granted and denied, and a throttle report
    Then /metrics counts grants and denials by reason, shows the permits held now, the pool's
    cooldown and the RPC latency histogram; /readyz says ready."""
    limiter = start_limiter(CONFIG)
    with limiter.client() as client:
        grants = [client.acquire("p", "acme", 10, 10, lease_ms=30_000) for _ in range(3)]
        assert all(isinstance(g, Grant) for g in grants)
        denied = client.acquire("p", "acme", 10, 10)
        assert isinstance(denied, Denial) and denied.reason is DenyReason.IN_FLIGHT
        client.report_throttle("p", 60_000)
        text = httpx.get(limiter.metrics_url, timeout=5).text
        assert metric(text, 'fatura_limiter_grants_total{pool="p"}') == 3
        assert metric(text, 'fatura_limiter_denials_total{pool="p",reason="IN_FLIGHT"}') == 1
        assert metric(text, 'fatura_limiter_pool_in_flight{pool="p"}') == 3
        assert metric(text, 'fatura_limiter_pool_in_flight_limit{pool="p"}') == 3
        assert metric(text, 'fatura_limiter_pool_headroom{dimension="in_flight",pool="p"}') == 0
        assert 0 < metric(text, 'fatura_limiter_pool_cooldown_remaining_seconds{pool="p"}') <= 60
        assert metric(text, 'fatura_limiter_throttle_reports_total{extended="true",pool="p"}') == 1
        assert metric(text, 'fatura_limiter_rpc_seconds_count{code="OK",method="Acquire"}') == 4
        assert metric(text, "fatura_limiter_redis_up") == 1
        for grant in grants:
            assert isinstance(grant, Grant)
            client.release(grant.permit_id, Outcome.NOT_SENT)
        text = httpx.get(limiter.metrics_url, timeout=5).text
        assert metric(text, 'fatura_limiter_pool_in_flight{pool="p"}') == 0
        assert metric(text, 'fatura_limiter_pool_headroom{dimension="in_flight",pool="p"}') == 3
        assert metric(text, 'fatura_limiter_releases_total{outcome="NOT_SENT",pool="p"}') == 3
    ready = httpx.get(limiter.metrics_url.replace("/metrics", "/readyz"), timeout=5)
    assert ready.status_code == 200


def test_sighup_reloads_pools_and_a_broken_file_keeps_the_running_config(start_limiter: StartLimiter) -> None:
    """Given a running limiter
    When its config file gains a pool and changes a limit, and it gets SIGHUP
    Then the new pool and limit apply; a later broken file + SIGHUP leaves them in force."""
    limiter = start_limiter(CONFIG)
    with limiter.client() as client:
        limiter.config_path.write_text(CONFIG.replace("max_in_flight = 3", "max_in_flight = 5") + NEW_POOL)
        limiter.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while client.pool_status("p").in_flight.limit != 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert client.pool_status("p").in_flight.limit == 5
        assert client.pool_status("q").requests.limit == 7
        listed = client.pool_statuses()  # every configured pool, the new one included, by name
        assert [(s.pool, s.requests.limit, s.in_flight.headroom) for s in listed] == [
            ("p", 1000, 5),
            ("q", 7, 1),
        ]
        limiter.config_path.write_text("[pools.p\n")
        limiter.signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reload failed" not in limiter.log() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "reload failed, keeping the previous one" in limiter.log()
        assert client.pool_status("q").requests.limit == 7


NEW_POOL = """
[pools.q]
rpm = 7
tpm = 1000
max_in_flight = 1
"""


def test_fatura_run_limiter_serves_and_stops_cleanly_on_sigterm(tmp_path: os.PathLike[str]) -> None:
    """`fatura run limiter` is the entry point `fatura up` uses: it serves, and SIGTERM ends it with 0."""
    config = os.path.join(tmp_path, "limiter.toml")
    with open(config, "w") as handle:
        handle.write(CONFIG)
    port = free_port()
    env = {
        **os.environ,
        "FATURA_REDIS_URL": SHARED_REDIS_URL,
        "FATURA_LIMITER_CONFIG": config,
        "FATURA_LIMITER_PORT": str(port),
        "FATURA_LIMITER_METRICS_PORT": str(free_port()),
        "FATURA_LIMITER_KEY_PREFIX": f"fatura:test:run{port}",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "services.cli.main", "run", "limiter"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 20
        status = None
        while status != health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
            assert process.poll() is None, process.communicate()[0]
            try:
                with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                    status = (
                        health_pb2_grpc.HealthStub(channel)
                        .Check(health_pb2.HealthCheckRequest(), timeout=1)
                        .status
                    )
            except grpc.RpcError:
                time.sleep(0.1)
        assert status == health_pb2.HealthCheckResponse.SERVING
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=20)[0].decode()
        assert process.returncode == 0, output
        assert "limiter stopped" in output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
