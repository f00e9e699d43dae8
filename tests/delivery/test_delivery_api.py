"""The webhook-endpoint API refuses bad input with a 422 JSON error and stores nothing, including
every target the egress guard refuses (the edge here has no FATURA_EGRESS_ALLOW, as in production)."""

from __future__ import annotations

import uuid

import httpx
import pytest

from fix_db import SyncPool, TenantHandle

PRIVATE_TARGETS = [
    "https://127.0.0.1/hook",
    "https://[::1]/hook",
    "https://10.0.0.1/hook",
    "https://172.16.0.1/hook",
    "https://192.168.1.1/hook",
    "https://169.254.169.254/latest/meta-data/",
    "https://100.64.0.1/hook",
    "https://[fc00::1]/hook",
    "https://[fe80::1]/hook",
    "https://[::ffff:127.0.0.1]/hook",
    "https://0.0.0.0/hook",
    "https://localhost/hook",
    "https://[2002:7f00:1::1]/hook",
    "https://224.0.0.1/hook",
    "https://[::127.0.0.1]/hook",  # IPv4-compatible loopback
    "https://[::ffff:0:a00:1]/hook",  # SIIT 10.0.0.1
    "https://[fec0::1]/hook",  # site-local
]

BAD_BODIES = [
    ({"url": "not a url"}, "invalid_endpoint"),
    ({"url": "ftp://erp.example/hook"}, "invalid_endpoint"),
    ({"url": "https://user:secret@erp.example/hook"}, "invalid_endpoint"),
    ({"url": "https:///hook"}, "invalid_endpoint"),
    ({"url": "https://erp.example/hook", "event_types": ["extraction.exploded.v1"]}, "invalid_request"),
    ({"url": "https://erp.example/hook", "event_types": []}, "invalid_request"),
    ({"url": "https://erp.example/hook", "colour": "blue"}, "invalid_request"),
    ({"url": "https://erp.example/hook", "secret": "whsec_short"}, "invalid_request"),
    ({"event_types": ["extraction.completed.v1"]}, "invalid_request"),
    ({"url": 42}, "invalid_request"),
    ({"url": "http://8.8.8.8/hook"}, "egress_refused"),  # public, but plain http
    ({"url": "https://no-such-host.invalid/hook"}, "egress_refused"),
]


def _endpoints(pool: SyncPool, tenant: TenantHandle) -> int:
    with pool.connection() as conn:
        row = conn.execute(
            "SELECT count(*) AS n FROM webhook_endpoints WHERE tenant_id = %s", (tenant.id,)
        ).fetchone()
    assert row is not None
    return int(row["n"])


@pytest.mark.parametrize("url", PRIVATE_TARGETS)
def test_a_private_target_is_refused_with_422_and_nothing_is_stored(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool, url: str
) -> None:
    response = client.post("/v1/webhook-endpoints", json={"url": url}, headers=tenant.headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "egress_refused"
    assert _endpoints(pool, tenant) == 0


def test_a_refusal_does_not_tell_the_client_which_address_its_host_resolved_to(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool
) -> None:
    # localhost resolves, on our side, to 127.0.0.1 and ::1: the client learns neither
    response = client.post(
        "/v1/webhook-endpoints", json={"url": "https://localhost/hook"}, headers=tenant.headers
    )
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "egress_refused" and error["message"]
    assert "127.0.0.1" not in response.text and "::1" not in response.text and "loopback" not in response.text
    assert _endpoints(pool, tenant) == 0


@pytest.mark.parametrize(("body", "code"), BAD_BODIES)
def test_a_bad_endpoint_definition_is_422_with_a_reason_and_nothing_is_stored(
    client: httpx.Client, tenant: TenantHandle, pool: SyncPool, body: dict[str, object], code: str
) -> None:
    response = client.post("/v1/webhook-endpoints", json=body, headers=tenant.headers)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert _endpoints(pool, tenant) == 0


def test_the_api_needs_a_key_and_json(client: httpx.Client, tenant: TenantHandle) -> None:
    assert client.post("/v1/webhook-endpoints", json={"url": "https://erp.example/"}).status_code == 401
    response = client.post("/v1/webhook-endpoints", content=b"url=x", headers=tenant.headers)
    assert response.status_code == 415


def test_another_tenants_endpoint_or_delivery_is_404(client: httpx.Client, tenant: TenantHandle) -> None:
    for action in ("disable", "enable", "rotate-secret"):
        response = client.post(f"/v1/webhook-endpoints/{uuid.uuid4()}:{action}", headers=tenant.headers)
        assert response.status_code == 404, response.text
    assert client.post(f"/v1/deliveries/{uuid.uuid4()}:resend", headers=tenant.headers).status_code == 404
    assert client.post("/v1/deliveries/not-a-uuid:resend", headers=tenant.headers).status_code == 404


def test_deliveries_need_a_job_id(client: httpx.Client, tenant: TenantHandle) -> None:
    assert client.get("/v1/deliveries", headers=tenant.headers).status_code == 400
    assert client.get("/v1/deliveries?job_id=nope", headers=tenant.headers).status_code == 400
    listed = client.get(f"/v1/deliveries?job_id={uuid.uuid4()}", headers=tenant.headers)
    assert listed.status_code == 200 and listed.json() == {"deliveries": []}


def test_recover_needs_a_date_time_with_a_zone(client: httpx.Client, tenant: TenantHandle) -> None:
    url = f"/v1/webhook-endpoints/{uuid.uuid4()}:recover"
    for since in ("yesterday", "2026-11-30T08:00:00"):
        response = client.post(url, json={"since": since}, headers=tenant.headers)
        assert response.status_code == 422, response.text
