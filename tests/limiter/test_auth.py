"""Who may call the limiter: the shared token (FATURA_LIMITER_TOKEN) on every LimiterService RPC,
health open to probes, reflection behind its own switch, and no limiter that listens beyond loopback
unauthenticated."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.settings import SettingsError
from services.limiter.client import LimiterUnauthenticated
from services.limiter.config import parse_config
from services.limiter.emergency import EmergencyQuota
from services.limiter.model import Denial, DenyReason, Grant, Outcome
from services.limiter.security import token_matches
from services.limiter.settings import LimiterSettings, is_loopback
from tests.limiter.conftest import spawn_limiter
from tests.limiter.test_operability import metric

if TYPE_CHECKING:
    from tests.limiter.conftest import LimiterProcess, StartLimiter

CONFIG = """
[pools.p]
pacing = "window"
rpm = 1000
tpm = 1000000
max_in_flight = 3
"""
TOKEN = "s3cret-limiter-token-0123456789"
WRONG = "wrong-limiter-token-9876543210"


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LimiterProcess]:
    """One limiter started with FATURA_LIMITER_TOKEN for the token tests of this module."""
    limiter = spawn_limiter(CONFIG, tmp_path_factory.mktemp("guarded"), env={"FATURA_LIMITER_TOKEN": TOKEN})
    try:
        limiter.wait_health(health_pb2.HealthCheckResponse.SERVING)
        yield limiter
    finally:
        limiter.stop()


def held(limiter: LimiterProcess) -> int:
    with limiter.client() as client:
        return client.pool_status("p").in_flight.used


@pytest.mark.parametrize("token", [None, WRONG], ids=["no token", "wrong token"])
def test_a_call_without_the_right_token_is_unauthenticated_and_changes_nothing(
    guarded: LimiterProcess, token: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a limiter started with a token
    When a client calls without it, or with another one
    Then every LimiterService RPC raises LimiterUnauthenticated (logged as a configuration error),
    no permit is taken, and the server counts the refusals."""
    before = held(guarded)
    with guarded.client(token=token) as client, caplog.at_level(logging.ERROR):
        with pytest.raises(LimiterUnauthenticated):
            client.acquire("p", "acme", 10, 10)
        with pytest.raises(LimiterUnauthenticated):
            client.pool_status("p")
        with pytest.raises(LimiterUnauthenticated):
            client.report_throttle("p", 60_000)
        with pytest.raises(LimiterUnauthenticated):
            client.release("p/acme/00000000000000000000000000000000", Outcome.NOT_SENT)
    refusals = [r for r in caplog.records if "UNAUTHENTICATED" in r.getMessage()]
    assert len(refusals) == 4  # one line per refused call, not one per layer
    assert all(TOKEN not in r.getMessage() and WRONG not in r.getMessage() for r in caplog.records)
    assert held(guarded) == before
    with guarded.client() as client:
        assert client.pool_status("p").cooldown_until_ms is None  # the throttle report changed nothing
    text = httpx.get(guarded.metrics_url, timeout=5).text
    # The client's acquire and release travel in Batch RPCs: refused (and counted) as such.
    assert metric(text, 'fatura_limiter_unauthenticated_total{method="Batch"}') >= 1
    assert TOKEN not in guarded.log() and WRONG not in guarded.log()


def test_a_wrong_token_never_opens_the_emergency_quota(guarded: LimiterProcess) -> None:
    """Given a client whose emergency quota is open (it would grant when the limiter is unreachable)
    When its token is refused
    Then acquire raises LimiterUnauthenticated: no emergency permit, no UNAVAILABLE denial."""
    quota = EmergencyQuota.from_config(parse_config(CONFIG), 1.0)
    with guarded.client(token=WRONG, emergency=quota) as client:
        with pytest.raises(LimiterUnauthenticated):
            client.acquire("p", "acme", 10, 10)
        assert quota.held("p") == 0


def test_the_right_token_gets_permits(guarded: LimiterProcess) -> None:
    with guarded.client() as client:
        grants = [client.acquire("p", "acme", 10, 10, lease_ms=30_000) for _ in range(3)]
        assert all(isinstance(g, Grant) for g in grants)
        denied = client.acquire("p", "acme", 10, 10)
        assert isinstance(denied, Denial) and denied.reason is DenyReason.IN_FLIGHT
        for grant in grants:
            assert isinstance(grant, Grant)
            assert client.renew(grant.permit_id, 30_000) >= grant.lease_expires_at_ms
            assert client.release(grant.permit_id, Outcome.COMPLETED, 5, 5) is True
        assert client.pool_status("p").in_flight.used == 0


def test_health_and_reflection_answer_without_a_token(guarded: LimiterProcess) -> None:
    """Platform probes carry no token: the standard health service answers them; reflection follows
    its own switch (on by default), not the token."""
    assert guarded.health() == health_pb2.HealthCheckResponse.SERVING
    assert guarded.health("fatura.limiter.v1.LimiterService") == health_pb2.HealthCheckResponse.SERVING
    with guarded.client(token=None) as anonymous:
        assert anonymous.readiness() is None
    assert "fatura.limiter.v1.LimiterService" in reflected_services(guarded)


def reflected_services(limiter: LimiterProcess) -> set[str]:
    with limiter.channel() as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        responses = stub.ServerReflectionInfo(iter([request]), timeout=5)
        return {s.name for s in next(iter(responses)).list_services_response.service}


def test_reflection_is_absent_when_switched_off(start_limiter: StartLimiter) -> None:
    """Given FATURA_LIMITER_REFLECTION=0 (production)
    Then the reflection service is not there (UNIMPLEMENTED), while health and permits still work."""
    limiter = start_limiter(CONFIG, env={"FATURA_LIMITER_REFLECTION": "0"})
    assert "reflection off" in limiter.log()
    with pytest.raises(grpc.RpcError) as missing:
        reflected_services(limiter)
    assert missing.value.code() is grpc.StatusCode.UNIMPLEMENTED
    assert limiter.health() == health_pb2.HealthCheckResponse.SERVING
    with limiter.client() as client:
        assert isinstance(client.acquire("p", "acme", 10, 10), Grant)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "limiter.internal"])
def test_a_limiter_beyond_loopback_without_a_token_or_mtls_refuses_to_start(
    tmp_path: Path, host: str
) -> None:
    """Given FATURA_LIMITER_HOST that other machines could reach, and neither a token nor client
    certificates
    Then the process exits with a settings error naming the variables, before it binds anything."""
    limiter = spawn_limiter(CONFIG, tmp_path, env={"FATURA_LIMITER_HOST": host})
    try:
        code = limiter.process.wait(timeout=30)
    finally:
        limiter.stop()
    log = limiter.log()
    assert code == 2, log
    assert f"FATURA_LIMITER_HOST={host!r} is not a loopback address" in log
    assert "FATURA_LIMITER_TOKEN" in log and "FATURA_LIMITER_TLS_CLIENT_CA" in log
    assert "listening" not in log


def test_a_malformed_token_stops_the_limiter_without_printing_it(tmp_path: Path) -> None:
    limiter = spawn_limiter(CONFIG, tmp_path, env={"FATURA_LIMITER_TOKEN": "short one"})
    try:
        code = limiter.process.wait(timeout=30)
    finally:
        limiter.stop()
    assert code == 2
    assert "FATURA_LIMITER_TOKEN must be at least 16" in limiter.log()
    assert "short one" not in limiter.log()


# Settings and the token check, without a server.


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("limiter.internal", False),
    ],
)
def test_loopback_is_decided_by_address_and_a_name_other_than_localhost_is_not(
    host: str, loopback: bool
) -> None:
    assert is_loopback(host) is loopback


def test_what_lets_a_limiter_listen_beyond_loopback(tmp_path: Path) -> None:
    """A token or client certificates (mTLS) authenticate callers; TLS alone does not."""
    pem = tmp_path / "x.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    beyond = {"FATURA_LIMITER_HOST": "0.0.0.0"}
    tls = {"FATURA_LIMITER_TLS_CERT": str(pem), "FATURA_LIMITER_TLS_KEY": str(pem)}
    LimiterSettings.from_env({}).check_listener()
    LimiterSettings.from_env({**beyond, "FATURA_LIMITER_TOKEN": TOKEN}).check_listener()
    LimiterSettings.from_env({**beyond, **tls, "FATURA_LIMITER_TLS_CLIENT_CA": str(pem)}).check_listener()
    with pytest.raises(SettingsError, match="not a loopback address"):
        LimiterSettings.from_env({**beyond, **tls}).check_listener()
    with pytest.raises(SettingsError, match="not a loopback address"):
        LimiterSettings.from_env(beyond).check_listener()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FATURA_LIMITER_TLS_CERT": "a.pem"}, "must be set together"),
        ({"FATURA_LIMITER_TLS_CLIENT_CA": "ca.pem"}, "needs FATURA_LIMITER_TLS_CERT"),
        ({"FATURA_LIMITER_TLS_CLIENT_KEY": "k.pem"}, "must be set together"),
        (
            {"FATURA_LIMITER_TLS_CLIENT_CERT": "c.pem", "FATURA_LIMITER_TLS_CLIENT_KEY": "k.pem"},
            "needs FATURA_LIMITER_TLS_CA",
        ),
        ({"FATURA_LIMITER_REFLECTION": "maybe"}, "FATURA_LIMITER_REFLECTION"),
        ({"FATURA_LIMITER_TOKEN": "abc def ghi jkl mno"}, "visible ASCII"),
    ],
)
def test_incomplete_or_malformed_security_settings_fail_fast(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        LimiterSettings.from_env(env)


def test_the_token_is_read_once_and_never_shown() -> None:
    settings = LimiterSettings.from_env({"FATURA_LIMITER_TOKEN": f"  {TOKEN} "})
    assert settings.token == TOKEN
    assert TOKEN not in repr(settings)
    assert LimiterSettings.from_env({}).token is None
    assert LimiterSettings.from_env({}).reflection is True
    assert LimiterSettings.from_env({"FATURA_LIMITER_REFLECTION": "off"}).reflection is False


@pytest.mark.parametrize(
    ("metadata", "accepted"),
    [
        ((("authorization", f"Bearer {TOKEN}"),), True),
        ((("authorization", f"bearer {TOKEN}"),), True),
        ((("authorization", f"Basic {TOKEN}"),), False),
        ((("authorization", f"Bearer {WRONG}"),), False),
        ((("authorization", f"Bearer {TOKEN[:-1]}"),), False),
        ((("authorization", f"Bearer {TOKEN}"), ("authorization", f"Bearer {WRONG}")), False),
        ((("x-token", TOKEN),), False),
        ((), False),
        (None, False),
    ],
)
def test_only_one_bearer_header_with_the_token_is_accepted(metadata: object, accepted: bool) -> None:
    assert token_matches(metadata, TOKEN) is accepted
