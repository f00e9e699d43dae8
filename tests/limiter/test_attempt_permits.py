"""The worker's permits for one attempt (services/inference/permits.py) against a real limiter:
every Acquire carries the attempt's request_key, and a pool that can never admit the request is a
skipped channel, not an error."""

from __future__ import annotations

from pathlib import Path

from grpc_health.v1 import health_pb2

from services.inference.permits import AttemptPermits
from services.inference.providers.base import PermitDenied, PermitGranted
from services.limiter import Grant, Outcome
from tests.limiter.conftest import spawn_limiter

CONFIG = """
[pools.gpu]
kind = "local"
rpm = 100000
tpm = 100000000
max_in_flight = 8
kv_token_capacity = 4000

[pools.fallback]
rpm = 100000
tpm = 100000000
max_in_flight = 8

[pools.small]
kind = "local"
rpm = 100000
tpm = 100000000
max_in_flight = 8
kv_token_capacity = 100
"""


def test_an_attempts_permits_carry_its_request_key_and_never_take_a_second_permit(tmp_path: Path) -> None:
    """Given an attempt whose claim holds the primary pool's permit
    When the gateway asks for a fallback pool, asks for it again after releasing it, and asks for a
    pool too small for the request
    Then the fallback's permit is the one the attempt's request_key names (a retried Acquire would
    find it), asking again after its release takes a fresh permit instead of failing, and the
    small pool is a denial the gateway skips; closing settles what is left."""
    limiter = spawn_limiter(CONFIG, tmp_path)
    try:
        limiter.wait_health(health_pb2.HealthCheckResponse.SERVING)
        with limiter.client() as client:
            key = "job-1:3"
            primary = client.acquire("gpu", "acme", 500, 200, lease_ms=30_000, request_key=key)
            assert isinstance(primary, Grant)
            permits = AttemptPermits(
                client,
                tenant="acme",
                estimated_input_tokens=500,
                max_output_tokens=200,
                lease_ms=30_000,
                primary_pool="gpu",
                primary=primary,
                request_key=key,
            )
            fallback = permits.acquire("fallback")
            assert isinstance(fallback, PermitGranted)
            same = client.acquire("fallback", "acme", 500, 200, lease_ms=30_000, request_key=key)
            assert isinstance(same, Grant) and same.permit_id == fallback.permit_id
            assert client.pool_status("fallback").in_flight.used == 1

            permits.release(fallback, Outcome.COMPLETED.value, 480, 150)
            again = permits.acquire("fallback")
            assert isinstance(again, PermitGranted) and again.permit_id != fallback.permit_id

            never = permits.acquire("small")
            assert isinstance(never, PermitDenied) and never.reason == "NEVER_ADMITTABLE"

            assert permits.acquire("gpu") == PermitGranted(primary.permit_id)
            permits.close()
            for pool in ("gpu", "fallback", "small"):
                assert client.pool_status(pool).in_flight.used == 0
    finally:
        limiter.stop()
